#!/usr/bin/env bash
# Install what narwhal_assets, its test fleet, the PostgreSQL test and the browser test need on a fresh Debian
# machine (idempotent). Sourced by scripts/demo.sh and scripts/test.sh; run as root (the test fleet creates
# network namespaces). Python packages are the pinned set in constraints.txt; `bash scripts/bootstrap.sh relock`
# re-resolves `.[test]` in a throwaway venv and rewrites that file.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# postgresql: the team-instance test starts its own throwaway server; chromium: the UI test's browser (Playwright
# drives this executable, it never downloads one).
apt_packages=(openssh-server openssh-client sshpass iproute2 git tmux procps util-linux passwd python3-venv
  postgresql chromium fonts-liberation)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python_bin="${PYTHON:-python3}"
pip_quiet=(-q --disable-pip-version-check)
if [[ "${BASH_SOURCE[0]}" == "$0" && "${1:-}" == relock ]]; then
  scratch="$(mktemp -d)"
  "$python_bin" -m venv "$scratch/venv"
  # No constraint at all while resolving (not even a machine-wide pip config one): the newest compatible set.
  PIP_CONSTRAINT=/dev/null "$scratch/venv/bin/python" -m pip install "${pip_quiet[@]}" --upgrade pip setuptools
  PIP_CONSTRAINT=/dev/null "$scratch/venv/bin/python" -m pip install "${pip_quiet[@]}" -e "$repo[test]" -e "$repo/fleet-sim"
  { sed -n '1,2p' "$repo/constraints.txt"
    "$scratch/venv/bin/python" -m pip freeze --all --exclude-editable | grep -vE '^narwhal[-_](assets|fleetsim)'
  } > "$scratch/constraints.txt"
  mv "$scratch/constraints.txt" "$repo/constraints.txt"
  rm -rf "$scratch"
  echo "bootstrap: rewrote $repo/constraints.txt"
  exit 0
fi
# PIP_CONSTRAINT replaces a machine-wide `global.constraint` from pip's config files, so these pins alone decide.
export PIP_CONSTRAINT="$repo/constraints.txt"
if [ ! -x "$repo/.venv/bin/python" ]; then
  "$python_bin" -m venv "$repo/.venv"
fi
"$repo/.venv/bin/python" -m pip install "${pip_quiet[@]}" --upgrade pip setuptools
# The simulated fleet is its own distribution (tests, benchmarks and the demo use it; the product wheel does not).
"$repo/.venv/bin/python" -m pip install "${pip_quiet[@]}" -e "$repo[test]" -e "$repo/fleet-sim"
# Editable installs are not byte-compiled, and where PYTHONDONTWRITEBYTECODE is set (CI images) every command
# would compile the package's sources again (a few tenths of a second per `deploy-hosts` process).
"$repo/.venv/bin/python" -m compileall -q "$repo/narwhal_assets" "$repo/fleet-sim/fleetsim" >/dev/null
unset PIP_CONSTRAINT
export PATH="$repo/.venv/bin:$PATH"
export DAGSTER_DISABLE_TELEMETRY=1

#!/usr/bin/env bash
# Install what narwhal_assets and its test fleet need on a fresh Debian machine (idempotent).
# Sourced by scripts/demo.sh and scripts/test.sh; run as root (the test fleet creates network namespaces).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
apt_packages=(openssh-server openssh-client sshpass iproute2 git tmux procps util-linux passwd python3-venv)
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
if [ ! -x "$repo/.venv/bin/python" ]; then
  "$python_bin" -m venv "$repo/.venv"
fi
"$repo/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$repo/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$repo[test]"
export PATH="$repo/.venv/bin:$PATH"
export DAGSTER_DISABLE_TELEMETRY=1

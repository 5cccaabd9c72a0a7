#!/usr/bin/env bash
# The README's test command: install everything, then run lint, the import contracts, the type check and the
# whole test suite. `--fast`, the everyday command: the same checks and only the unit tier (tests/unit and
# tests/contract: no root, no simulated fleet) spread over every CPU, with the .venv as it is (installed only
# when there is none). `--under-load`: the fleet tier (tests/fleet, or the tests named in the arguments) on a
# busy machine, as a loaded 2-CPU workstation or CI runner would run it: one busy-loop process per CPU at the
# tests' own priority (nice 0) while pytest runs, killed when the script exits however it ends (a trap; each loop
# also stops once the script is gone, even after SIGKILL); the .venv as with --fast, no lint or type check.
# Arguments after the option go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fast=0
under_load=0
case "${1:-}" in
  --fast) fast=1; shift ;;
  --under-load) under_load=1; shift ;;
esac
if [ "$((fast + under_load))" -eq 1 ] && [ -x "$here/../.venv/bin/python" ]; then
  repo="$(cd "$here/.." && pwd)"
  export PATH="$repo/.venv/bin:$PATH" DAGSTER_DISABLE_TELEMETRY=1
else
  source "$here/bootstrap.sh"
fi
cd "$repo"
if [ "$under_load" -eq 1 ]; then
  named_path=0
  for arg in "$@"; do
    [ -e "${arg%%::*}" ] && named_path=1
  done
  [ "$named_path" -eq 1 ] || set -- "$@" tests/fleet
  hogs=()
  stop_hogs() {
    if ((${#hogs[@]})); then
      kill "${hogs[@]}" 2>/dev/null || true
      wait "${hogs[@]}" 2>/dev/null || true
    fi
    hogs=()
  }
  trap stop_hogs EXIT
  trap 'stop_hogs; exit 130' INT
  trap 'stop_hogs; exit 143' TERM
  cpus="$(nproc)"
  for _ in $(seq "$cpus"); do
    # Each loop also ends by itself once this script is gone, even if it was SIGKILLed (no trap runs then).
    nice -n 0 sh -c 'while kill -0 "$1" 2>/dev/null; do :; done' test.sh-hog "$$" &
    hogs+=("$!")
  done
  echo "test.sh: $cpus busy-loop processes (pids ${hogs[*]}) while pytest runs" >&2
else
  ruff check .
  lint-imports --no-cache
  mypy
fi
if [ "$fast" -eq 1 ]; then
  # pytest-xdist: one worker per CPU and one more (some tests wait on a deadline: the spare fills it), and
  # idle workers steal queued tests (the few that build a virtualenv would otherwise end the run alone).
  set -- -n "$(($(nproc) + 1))" --dist worksteal tests/unit tests/contract "$@"
fi
# Where PYTHONDONTWRITEBYTECODE is set (CI images), pytest would compile and rewrite every test module again in
# each worker on every run (about 4 CPU-s a worker): bytecode is cached for the tests as for the package.
unset PYTHONDONTWRITEBYTECODE
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$rc"

#!/usr/bin/env bash
# The README's test command: install everything, then run lint, the import contracts, the type check and the
# whole test suite. `--fast`, the everyday command: the same checks and only the unit tier (tests/unit and
# tests/contract: no root, no simulated fleet) spread over every CPU, with the .venv as it is (installed only
# when there is none). Arguments after that go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fast=0
if [ "${1:-}" = --fast ]; then
  fast=1
  shift
fi
if [ "$fast" -eq 1 ] && [ -x "$here/../.venv/bin/python" ]; then
  repo="$(cd "$here/.." && pwd)"
  export PATH="$repo/.venv/bin:$PATH" DAGSTER_DISABLE_TELEMETRY=1
else
  source "$here/bootstrap.sh"
fi
cd "$repo"
ruff check .
lint-imports --no-cache
mypy
if [ "$fast" -eq 1 ]; then
  set -- -n auto tests/unit tests/contract "$@"  # pytest-xdist: one worker per CPU
fi
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$rc"

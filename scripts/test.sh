#!/usr/bin/env bash
# The README's test command: install everything, then run lint and the whole test suite.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/bootstrap.sh"
cd "$repo"
ruff check .
lint-imports --no-cache
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; failing" >&2
  exit 1
fi
exit "$rc"

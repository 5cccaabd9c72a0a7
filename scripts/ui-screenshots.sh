#!/usr/bin/env bash
# Regenerate docs/ui/*.png: runs the browser test (tests/e2e), which saves its screenshots where
# NARWHAL_UI_SCREENSHOTS points. Needs what the test needs (root, the simulated fleet, chromium); CI=true makes
# a missing one fail instead of skipping.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/bootstrap.sh"
cd "$repo"
mkdir -p docs/ui
CI=true NARWHAL_UI_SCREENSHOTS="$repo/docs/ui" python -m pytest -q -p no:cacheprovider tests/e2e
echo "ui-screenshots: $(ls docs/ui/*.png | wc -l) screenshots in docs/ui/"

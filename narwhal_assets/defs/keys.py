"""The asset and check keys that readers of the instance need, spelled once, apart from the assets' definitions.

`deploy-hosts status`, the install checks and their sensors read these assets' history; importing the keys
from here does not load the asset definitions (their pydantic models, SSH and workflow modules), which cost
`status` about 0.4 s before it could record anything.
"""

from __future__ import annotations

import dagster as dg

DEPLOYMENT_MANIFEST = dg.AssetKey("deployment_manifest")
PREPARE_COMMAND = "deploy-hosts prepare"  # the command that materializes it, named when it never was
INSTALLATION = dg.AssetKey("host_installation")
OUTDATED_CHECK = dg.AssetCheckKey(INSTALLATION, "installed_from_latest_manifest")  # installation/checks.py
# The checks `prepare_job` runs on every prepared run (defs/prepare/assets.PREPARE_CHECKS); an install takes
# only a run whose checks all passed (defs/installation/prepared.py).
PREPARE_CHECK_NAMES = ("bundle_clones_to_revision", "prepared_files_private", "prepared_files_hold_no_access")

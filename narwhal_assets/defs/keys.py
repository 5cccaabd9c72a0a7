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

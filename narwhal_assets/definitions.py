"""The Dagster code location: every asset, check, job, sensor and resource of narwhal_assets."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.assets.checks import checkpoint_replicas_agree, generated_files_private, known_hosts_cover_inventory
from narwhal_assets.assets.discovery import discovered_config, host_discovery
from narwhal_assets.assets.install import host_installation, install_job
from narwhal_assets.assets.inventory import host_inventory
from narwhal_assets.assets.prepare import PREPARE_CHECKS, prepare_deployment
from narwhal_assets.resources import NarwhalSettings, SshSettings

ALL_ASSETS = [host_inventory, host_discovery, discovered_config, prepare_deployment, host_installation]
ALL_CHECKS: list[dg.AssetChecksDefinition] = [
    known_hosts_cover_inventory,
    checkpoint_replicas_agree,
    generated_files_private,
    *PREPARE_CHECKS,
]


DISCOVERY = dg.AssetSelection.groups("discovery")
# The main job: what `deploy-hosts discover` materializes, runnable (and schedulable) from the UI too.
discovery_job = dg.define_asset_job("discovery_job", selection=DISCOVERY, description="Inventory, host keys, "
                                    "observations, checkpoint digests and the discovered config set")  # fmt: skip
DEPLOYMENT = dg.AssetSelection.groups("deployment")
# What `deploy-hosts prepare` materializes: source bundle, role environments and manifest, with their checks.
prepare_job = dg.define_asset_job("prepare_job", selection=DEPLOYMENT, description="One verified deployment "
                                  "directory from the discovered config set")  # fmt: skip


def resources() -> dict[str, object]:
    return {"narwhal": NarwhalSettings(), "ssh": SshSettings()}


defs = dg.Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[discovery_job, prepare_job, install_job],
    resources=resources(),
)

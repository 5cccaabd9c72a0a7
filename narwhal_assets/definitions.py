"""The Dagster code location: every asset, check, job, sensor and resource of narwhal_assets."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.assets.checks import checkpoint_replicas_agree, generated_files_private, known_hosts_cover_inventory
from narwhal_assets.assets.discovery import discovered_config, host_discovery
from narwhal_assets.assets.inventory import host_inventory
from narwhal_assets.resources import NarwhalSettings, SshSettings

ALL_ASSETS = [host_inventory, host_discovery, discovered_config]
ALL_CHECKS: list[dg.AssetChecksDefinition] = [
    known_hosts_cover_inventory,
    checkpoint_replicas_agree,
    generated_files_private,
]


def resources() -> dict[str, object]:
    return {"narwhal": NarwhalSettings(), "ssh": SshSettings()}


defs = dg.Definitions(assets=ALL_ASSETS, asset_checks=ALL_CHECKS, resources=resources())

"""The Dagster code location: every asset, check, job, sensor and resource of narwhal_assets."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.assets.checks import checkpoint_replicas_agree, generated_files_private, known_hosts_cover_inventory
from narwhal_assets.assets.discovery import discovered_config, host_discovery
from narwhal_assets.assets.freshness import discovered_set_fresh, discovery_freshness_sensor
from narwhal_assets.assets.inventory import host_inventory
from narwhal_assets.resources import NarwhalSettings, SshSettings
from narwhal_assets.schedules import weekly_full_rehash
from narwhal_assets.sensors import inventory_sensor, rediscovery_sensor

ALL_ASSETS = [host_inventory, host_discovery, discovered_config]
ALL_CHECKS: list[dg.AssetChecksDefinition] = [
    known_hosts_cover_inventory,
    checkpoint_replicas_agree,
    generated_files_private,
    discovered_set_fresh,
]
SENSORS = [inventory_sensor, rediscovery_sensor, discovery_freshness_sensor]
SCHEDULES = [weekly_full_rehash]


DISCOVERY = dg.AssetSelection.groups("discovery")
# The main job: what `deploy-hosts discover` materializes, runnable (and schedulable) from the UI too.
discovery_job = dg.define_asset_job("discovery_job", selection=DISCOVERY, description="Inventory, host keys, "
                                    "observations, checkpoint digests and the discovered config set")  # fmt: skip


def resources() -> dict[str, object]:
    return {"narwhal": NarwhalSettings(), "ssh": SshSettings()}


defs = dg.Definitions(assets=ALL_ASSETS, asset_checks=ALL_CHECKS, jobs=[discovery_job], sensors=SENSORS,
                      schedules=SCHEDULES, resources=resources())  # fmt: skip

"""The Dagster code location: every asset, check, job, sensor and resource of narwhal_assets."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.assets.inventory import host_inventory
from narwhal_assets.resources import NarwhalSettings

ALL_ASSETS = [host_inventory]
ALL_CHECKS: list[dg.AssetChecksDefinition] = []


def resources() -> dict[str, object]:
    return {"narwhal": NarwhalSettings()}


defs = dg.Definitions(assets=ALL_ASSETS, asset_checks=ALL_CHECKS, resources=resources())

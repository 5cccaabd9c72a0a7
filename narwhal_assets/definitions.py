"""The Dagster code location: every asset, check, job and resource of narwhal_assets."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import dagster as dg

from narwhal_assets.defs.discovery.assets import discovered_config, host_discovery
from narwhal_assets.defs.discovery.checks import (
    checkpoint_replicas_agree,
    generated_files_private,
    known_hosts_cover_inventory,
)
from narwhal_assets.defs.discovery.freshness import discovery_freshness
from narwhal_assets.defs.discovery.inventory import host_inventory
from narwhal_assets.defs.installation.assets import host_installation, install_job
from narwhal_assets.defs.installation.checks import installation_outdated_sensor, installed_from_latest_manifest
from narwhal_assets.defs.installation.status import live_matches_installed
from narwhal_assets.defs.names import DISCOVERY_JOB, OWNERS, PREPARE_JOB
from narwhal_assets.defs.prepare.assets import PREPARE_CHECKS, prepare_deployment
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings, default_root
from narwhal_assets.defs.schedules import reverify_installed_hosts, weekly_full_rehash
from narwhal_assets.defs.sensors import inventory_sensor, rediscovery_sensor
from narwhal_assets.local.process_env import make_process_private
from narwhal_assets.workflows.rollout import Progress

DISCOVERY_ASSETS = [host_inventory, host_discovery, discovered_config]
# Every asset says who owns it and links to its code (the UI's "Source" link): set here once for all of them.
with warnings.catch_warnings():  # code references are Dagster's beta API; a warning on every load is noise
    warnings.simplefilter("ignore", dg.BetaWarning)
    # It returns the assets it was given, typed as every kind of definition it accepts.
    ALL_ASSETS = cast("Sequence[dg.AssetsDefinition]", dg.with_source_code_references(dg.map_asset_specs(
        lambda spec: spec.replace_attributes(owners=OWNERS),
        [*DISCOVERY_ASSETS, prepare_deployment, host_installation],
    )))  # fmt: skip
ALL_CHECKS: list[dg.AssetChecksDefinition] = [
    known_hosts_cover_inventory,
    checkpoint_replicas_agree,
    generated_files_private,
    installed_from_latest_manifest,
    *PREPARE_CHECKS,
    live_matches_installed,
]
SENSORS = [inventory_sensor, rediscovery_sensor, installation_outdated_sensor]
SCHEDULES = [weekly_full_rehash, reverify_installed_hosts]

# The main job: what `deploy-hosts discover` runs, runnable (and schedulable) from the UI too. Selecting the
# assets themselves (not `AssetSelection.groups`) avoids that API's beta `include_sources` warning path.
discovery_job = dg.define_asset_job(
    DISCOVERY_JOB,
    selection=dg.AssetSelection.assets(*DISCOVERY_ASSETS),
    description="Inventory, host keys, observations, checkpoint digests and the discovered config set",
)
# What `deploy-hosts prepare` runs: source bundle, role environments and manifest, with their checks.
prepare_job = dg.define_asset_job(
    PREPARE_JOB,
    selection=dg.AssetSelection.assets(prepare_deployment),
    description="One verified prepared run (runs/deployment-env/<id>/) from the discovered config set",
)
JOBS = [discovery_job, prepare_job, install_job]


def make_definitions(root: str = "", progress: Progress | None = None) -> dg.Definitions:
    """The code location bound to a management checkout (empty: `NARWHAL_ROOT` or the working directory);
    `progress`: what an in-process command shares with the fleet operation it runs (else each run its own)."""
    fleet_progress = (dg.ResourceDefinition.hardcoded_resource(progress) if progress is not None
                      else dg.ResourceDefinition(resource_fn=lambda _: Progress()))  # fmt: skip
    freshness = discovery_freshness(Path(root or default_root()))
    assets = dg.map_asset_specs(
        lambda spec: spec.replace_attributes(freshness_policy=freshness) if spec.group_name == "discovery" else spec,
        ALL_ASSETS,
    )  # the discovered set's freshness, as the checkout's NARWHAL_DISCOVERY_MAX_AGE says
    return dg.Definitions(
        assets=assets,
        asset_checks=ALL_CHECKS,
        jobs=JOBS,
        sensors=SENSORS,
        schedules=SCHEDULES,
        resources={"checkout": ManagementCheckout(root=root), "ssh": SshSettings(), "progress": fleet_progress},
        # Every job's steps depend on each other (a host's parallelism is inside its step, hosts are
        # partitions, each its own run): a process per step would only add ~3 s of imports to each.
        executor=dg.in_process_executor,
    )


@dg.definitions
def defs() -> dg.Definitions:
    """The code location as Dagster's tools load it (`-m narwhal_assets.definitions`: `dagster dev`, the code
    server, every run worker), each process made private first: Dagster's storage and compute logs are
    created private, and a password or destination a Dagster command copied from a `.env` into the
    environment is removed before it reaches any process started from here (named in a warning, never
    shown). Importing this module changes nothing."""
    make_process_private(Path(default_root()))
    return make_definitions()

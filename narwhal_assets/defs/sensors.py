"""Sensors: the fleet watches itself. Thin Dagster layer over `core.discovery.watch`, `core.discovery.drift` and
`workflows.rediscover`.

- `inventory_sensor`: the operator's inputs by content hash (cursor); keeps `narwhal_hosts` equal to the
  inventory and requests `discovery_job` once per new input state.
- `rediscovery_sensor`: every `NARWHAL_REDISCOVERY_INTERVAL`, the drift probe over one strict connection per
  host; drift requests `discovery_job`, tagged per host with what drifted.

Both are stopped by default: they open SSH connections to the fleet, so an operator turns them on (UI
Automation page, or `dagster sensor start`).
"""

import json
import os
from pathlib import Path

import dagster as dg

from narwhal_assets.core.discovery.manifest import DiscoveryManifest
from narwhal_assets.core.discovery.watch import input_states, parse_duration, rediscovery_reasons, run_key
from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.core.inputs.settings import DOTENV, Settings
from narwhal_assets.defs.discovery.assets import OBSERVATIONS
from narwhal_assets.defs.lineage import latest_path
from narwhal_assets.defs.names import DISCOVERY_JOB, TRIGGER_TAG
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME, partition_requests
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.local.privatefiles import sha256_file
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.discover import DiscoveryRun, latest_complete_run, operator_settings
from narwhal_assets.workflows.rediscover import check_drift

AUTOMATION_DEFAULT = dg.DefaultSensorStatus.STOPPED
INVENTORY_TICK_S = 30
INTERVAL_VARIABLE = "NARWHAL_REDISCOVERY_INTERVAL"
DEFAULT_INTERVAL = "1h"


def rediscovery_interval() -> int:
    """Seconds between drift probes, from the process environment of the code location (read at load)."""
    return parse_duration(INTERVAL_VARIABLE, os.environ.get(INTERVAL_VARIABLE) or DEFAULT_INTERVAL)


def watched_hashes(settings: Settings) -> dict[str, str | None]:
    """Label (path relative to the checkout) -> SHA-256 of each watched input, None when it does not exist."""
    paths = [settings.root / DOTENV, settings.deployment_env_path, settings.hosts_path, settings.ssh_config_path,
             settings.known_hosts_path]  # fmt: skip
    return {_label(settings, p): sha256_file(p) if p.is_file() else None for p in paths if p is not None}


def published_hashes(settings: Settings) -> dict[str, str] | None:
    """The files (label -> SHA-256) the latest complete discovery published; None when none completed."""
    run = latest_complete_run(settings)
    if run is None:
        return None
    return dict(DiscoveryManifest.load(run.run_dir).files)


@dg.sensor(
    name="inventory_sensor",
    job_name=DISCOVERY_JOB,
    minimum_interval_seconds=INVENTORY_TICK_S,
    default_status=AUTOMATION_DEFAULT,
    description="Watches .env, config/deployment.env, the inventory, the SSH client config and the known-hosts "
    "store by content hash; keeps the narwhal_hosts partitions equal to the inventory and runs discovery_job "
    "once per new input state. A .env that does not parse is skipped, naming file and line.",
)  # fmt: skip
def inventory_sensor(
    context: dg.SensorEvaluationContext, checkout: ManagementCheckout
) -> dg.SensorResult | dg.SkipReason:
    try:
        opened = checkout.open()
        settings, inventory = opened.settings, opened.inventory
        published = published_hashes(settings)
    except InputError as exc:
        return dg.SkipReason(f"inputs not usable, nothing requested:\n{exc}")
    states = input_states(watched_hashes(settings), published or {})
    previous = json.loads(context.cursor) if context.cursor else None
    reasons = rediscovery_reasons(previous, states, discovered=published is not None)
    current = context.instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)
    partitions = partition_requests(current, inventory.host_ids())
    runs = [dg.RunRequest(run_key=run_key(states), tags={TRIGGER_TAG: "inputs"})] if reasons else []
    context.log.info("; ".join(reasons) or "inputs unchanged")
    return dg.SensorResult(
        run_requests=runs,
        skip_reason=None if runs else f"inputs unchanged ({', '.join(sorted(states))})",
        cursor=json.dumps(states, sort_keys=True),
        dynamic_partitions_requests=partitions,
    )


@dg.sensor(
    name="rediscovery_sensor",
    job_name=DISCOVERY_JOB,
    minimum_interval_seconds=rediscovery_interval(),
    default_status=AUTOMATION_DEFAULT,
    description="Every NARWHAL_REDISCOVERY_INTERVAL (default 1h): a drift probe over one strict SSH connection "
    "per host (host key, engine image id, model config.json hash, checkpoint files' size/mtime/inode, GPUs, "
    "fabric addresses) against the latest discovery; drift runs discovery_job tagged with each host and what "
    "drifted. A changed host key is drift and is refused, never enrolled.",
)  # fmt: skip
def rediscovery_sensor(
    context: dg.SensorEvaluationContext, checkout: ManagementCheckout, ssh: SshSettings
) -> dg.SensorResult | dg.SkipReason:
    try:
        run = DiscoveryRun.load(latest_path(context.instance, OBSERVATIONS, "run_dir"))
        opened = checkout.open()
        settings = operator_settings(opened.settings)
        report = check_drift(settings, opened.inventory, run, ssh.connector(settings, TrustMode.STRICT))
    except NarwhalError as exc:
        return dg.SkipReason(f"drift not checked:\n{exc}")
    drift = {host: [f"{c.kind}: {c.detail}" for c in changes] for host, changes in report.drift.items()}
    observation = dg.AssetObservation(
        asset_key=OBSERVATIONS,
        metadata={
            "drift_run": report.run_dir,
            "drift": dg.MetadataValue.json(drift),
            "not_checked": dg.MetadataValue.json(report.unreachable),
            "unchanged": sorted(report.unchanged),
            "checkpoint_files_statted": report.files_checked,
        },
    )  # fmt: skip
    if not report.drift:
        return dg.SensorResult(skip_reason="\n".join([report.checked(), *report.lines()]), asset_events=[observation])
    context.log.info("\n".join(report.lines()))
    request = dg.RunRequest(run_key=report.run_key(), tags={TRIGGER_TAG: "drift", **report.tags()})
    return dg.SensorResult(run_requests=[request], asset_events=[observation])


def _label(settings: Settings, path: Path) -> str:
    """The name the discovery manifest uses for a file: relative to the checkout when inside it."""
    return str(path.relative_to(settings.root)) if path.is_relative_to(settings.root) else str(path)

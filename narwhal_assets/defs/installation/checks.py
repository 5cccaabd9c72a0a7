"""`installed_from_latest_manifest`: `host_installation` partitions installed from an older prepared run, named.

Dagster's own per-partition staleness ("has a new dependency materialization") marks every partition after
any new `deployment_manifest` materialization, and the asset graph never shows it for a partitioned asset;
this check compares deployment ids, so it names exactly the hosts that run another (or no) deployment. It
runs in every `install_job` run (after the partition's materialization, never blocking it), and
`installation_outdated_sensor` re-evaluates it when a new `deployment_manifest` is materialized.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from narwhal_assets.core.deployment.installed import CURRENT, HostState, Installed, compare_installed
from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.defs.evaluations import as_result
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, INSTALLATION, OUTDATED_CHECK, PREPARE_COMMAND
from narwhal_assets.defs.lineage import latest_metadata
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME

CHECK_NAME = OUTDATED_CHECK.name
SENSOR_TICK_S = 60
COLUMNS = ["host", "state", "installed_deployment", "installed_revision", "latest_deployment"]


@dataclass(frozen=True)
class LatestManifest:
    """The latest `deployment_manifest` materialization: its prepared directory and deployment."""

    run_dir: Path
    deployment_id: str
    revision: str


def latest_manifest(instance: dg.DagsterInstance) -> LatestManifest:
    """Raises NarwhalError when nothing was prepared (or the materialization lacks the fields)."""
    metadata = latest_metadata(instance, DEPLOYMENT_MANIFEST, PREPARE_COMMAND)
    try:
        return LatestManifest(Path(str(metadata["out"].value)), str(metadata["deployment_id"].value),
                              str(metadata["revision"].value))  # fmt: skip
    except KeyError as exc:
        raise NarwhalError(f"deployment_manifest: its materialization records no {exc}; prepare again") from None


def latest_installs(instance: dg.DagsterInstance, host_ids: Sequence[str]) -> dict[str, Installed | None]:
    """Each host's latest successful installation (a failed one is an observation and does not count).

    The one reader of installations from Dagster: the outdated check, the re-verification schedule and the
    live-drift check all use it.
    """
    if not host_ids:
        return {}
    latest = instance.get_latest_storage_id_by_partition(
        INSTALLATION, dg.DagsterEventType.ASSET_MATERIALIZATION, partitions=set(host_ids)
    )  # one query for every partition's latest id, one for their records: not a query per host
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=INSTALLATION, storage_ids=list(latest.values())), limit=len(latest)
    ).records if latest else []  # fmt: skip
    found: dict[str, Installed | None] = dict.fromkeys(host_ids)
    for record in records:
        if record.partition_key in found and record.asset_materialization is not None:
            found[record.partition_key] = _installed(record.asset_materialization.metadata, record.timestamp)
    return found


def installation_states(instance: dg.DagsterInstance) -> tuple[LatestManifest, list[HostState]]:
    """The latest manifest and every `narwhal_hosts` partition's state against it."""
    manifest = latest_manifest(instance)
    hosts = sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME))
    return manifest, compare_installed(manifest.deployment_id, latest_installs(instance, hosts))


def evaluate_installed(instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    """Passes when every host partition's latest installation has the latest manifest's deployment id."""
    try:
        manifest, states = installation_states(instance)
    except NarwhalError as exc:
        return _evaluation(False, f"not evaluated: {exc}", {})
    behind = [s for s in states if s.state != CURRENT]
    rows = [dg.TableRecord({"host": s.host_id, "state": s.state,
                            "installed_deployment": s.installed.deployment_id if s.installed else "",
                            "installed_revision": s.installed.revision if s.installed else "",
                            "latest_deployment": manifest.deployment_id}) for s in states]  # fmt: skip
    metadata = {
        "latest_deployment": manifest.deployment_id,
        "latest_revision": manifest.revision,
        "run_dir": dg.MetadataValue.path(str(manifest.run_dir)),
        "hosts": dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[dg.TableColumn(c) for c in COLUMNS])),
    }
    if behind:
        named = ", ".join(f"{s.host_id} ({s.state}" + (f": {s.installed.deployment_id})" if s.installed else ")")
                          for s in behind)  # fmt: skip
        return _evaluation(False, f"not on the latest deployment {manifest.deployment_id}: {named}", metadata)
    return _evaluation(True, f"all {len(states)} host(s) installed from {manifest.deployment_id}", metadata)


def _installed(metadata: Mapping[str, dg.MetadataValue], timestamp: float) -> Installed | None:
    if "deployment_id" not in metadata or "revision" not in metadata:
        return None
    return Installed(str(metadata["deployment_id"].value), str(metadata["revision"].value), timestamp)


def _evaluation(passed: bool, description: str, metadata: Mapping[str, Any]) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(asset_key=INSTALLATION, check_name=CHECK_NAME, passed=passed,
                                   description=description, metadata=dict(metadata),
                                   severity=dg.AssetCheckSeverity.WARN)  # fmt: skip


@dg.asset_check(
    asset=INSTALLATION,
    name=CHECK_NAME,
    description="Every narwhal_hosts partition's latest installation is of the latest deployment_manifest "
    "(WARN, naming each host installed from another deployment or never installed)",
)
def installed_from_latest_manifest(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    found = evaluate_installed(context.instance)
    return as_result(found)


@dg.sensor(name="installation_outdated_sensor", minimum_interval_seconds=SENSOR_TICK_S,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description=f"Re-evaluates {CHECK_NAME} (no run, no SSH) once per new deployment_manifest "
           "materialization, so the hosts a new prepare left behind show as outdated in the UI.")  # fmt: skip
def installation_outdated_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    records = context.instance.fetch_materializations(DEPLOYMENT_MANIFEST, limit=1).records
    if not records:
        return dg.SkipReason("nothing prepared yet: deployment_manifest has never been materialized")
    cursor = str(records[0].storage_id)
    if context.cursor == cursor:
        return dg.SkipReason("no new deployment_manifest since the last evaluation")
    return dg.SensorResult(asset_events=[evaluate_installed(context.instance)], cursor=cursor)

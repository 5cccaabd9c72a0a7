"""Live deployments on `host_installation`: per-host observations from `deploy-hosts status`, and a drift check.

`status` records, per reachable host, a runless `AssetObservation` on the host's partition (live deployment,
its revision and state, a table of every directory there), so the UI shows each host's live revision beside
its last materialization. `live_matches_installed` compares the two per partition (the rule is
`core.deployment.live.drifting`) and fails naming each drifting host, with a table of revisions per host;
`status` reports its evaluation runless too, so it needs no run.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg

from narwhal_assets.core.deployment.live import Recorded, drifting
from narwhal_assets.defs.evaluations import as_result
from narwhal_assets.defs.installation.checks import latest_installs
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.names import DEPLOYMENT_TAG, INSTALL_JOB
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME, RANGE_END_TAG, RANGE_START_TAG

if TYPE_CHECKING:
    from narwhal_assets.workflows.status import HostStatus

CHECK_NAME = "live_matches_installed"
LIVE_KEY = "live_deployment_id"
READ_STARTED_KEY = "read_started_at"  # when status began reading the host (the drift rule's observation time)
IN_PROGRESS_KEY = "install_in_progress"
SCAN = 50  # observations read per host to find the newest status one (failed installs observe too)
ENDED_BADLY = [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
DIRECTORY_COLUMNS = ["deployment_id", "state", "revision", "check", "current"]
REVISION_COLUMNS = ["host", "installed_revision", "installed_deployment", "live_revision", "live_deployment", "drift"]


def _table(columns: list[str], rows: list[dict[str, str | bool]]) -> dg.TableMetadataValue:
    schema = dg.TableSchema(columns=[dg.TableColumn(name, "bool" if name in ("current", "drift") else "string")
                                     for name in columns])  # fmt: skip
    return dg.MetadataValue.table(records=[dg.TableRecord(row) for row in rows], schema=schema)


def status_observation(status: "HostStatus") -> dg.AssetObservation:
    """What one host runs now, as an observation of its `host_installation` partition."""
    live = status.live
    rows: list[dict[str, str | bool]] = [
        {"deployment_id": d.name, "state": d.state, "revision": d.revision or "", "check": d.check,
         "current": d.name == status.current} for d in status.deployments
    ]  # fmt: skip
    metadata: dict[str, Any] = {
        LIVE_KEY: status.current or "",
        "live_revision": live.revision or "" if live else "",
        "live_state": live.state if live else "none",
        "live_check": live.check if live else "none",
        "problems": "; ".join(status.problems()) or "none",
        "directories": _table(DIRECTORY_COLUMNS, rows),
        READ_STARTED_KEY: dg.MetadataValue.timestamp(status.read_started_at),
        IN_PROGRESS_KEY: any(d.state == "locked" for d in status.deployments),
    }
    said = f"status: current {status.current or 'none'}" + (f" ({live.state}, {live.check})" if live else "")
    return dg.AssetObservation(asset_key=INSTALLATION, partition=status.host_id, description=said, metadata=metadata)


def _live(instance: dg.DagsterInstance, host_id: str) -> Recorded | None:
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=INSTALLATION, asset_partitions=[host_id]), limit=SCAN
    ).records
    for record in records:
        observation = record.asset_observation
        if observation is not None and LIVE_KEY in observation.metadata:
            meta = observation.metadata
            started = meta.get(READ_STARTED_KEY)
            busy = meta.get(IN_PROGRESS_KEY)
            return Recorded(_text(meta, LIVE_KEY), _text(meta, "live_revision"),
                            float(started.value) if started is not None else record.timestamp,  # type: ignore[arg-type]
                            bool(busy.value) if busy is not None else False)  # fmt: skip
    return None


def _text(metadata: "Mapping[str, dg.MetadataValue[Any]]", key: str) -> str | None:
    value = metadata.get(key)
    return str(value.value) or None if value is not None else None


def evaluate_drift(instance: dg.DagsterInstance, host_ids: Sequence[str]) -> tuple[list[str], dg.AssetCheckEvaluation]:
    """Per host: last installed vs newest live observation; fails naming each host that drifted."""
    installed = latest_installs(instance, host_ids)
    live = {host_id: _live(instance, host_id) for host_id in host_ids}
    drifted = drifting(installed, live)
    rows: list[dict[str, str | bool]] = []
    for host_id in host_ids:
        done, seen = installed[host_id], live[host_id]
        rows.append({"host": host_id, "installed_revision": (done and done.revision) or "",
                     "installed_deployment": (done and done.deployment_id) or "",
                     "live_revision": (seen and seen.revision) or "", "live_deployment": (seen and seen.deployment_id)
                     or "", "drift": host_id in drifted})  # fmt: skip
    description = (f"drifting: {', '.join(drifted)} run another deployment than last installed" if drifted else
                   "every observed host runs the deployment last installed there")  # fmt: skip
    return drifted, dg.AssetCheckEvaluation(
        asset_key=INSTALLATION, check_name=CHECK_NAME, passed=not drifted, description=description,
        metadata={"drifting_hosts": ", ".join(drifted) or "none", "revisions": _table(REVISION_COLUMNS, rows)},
    )  # fmt: skip


def record_statuses(
    instance: dg.DagsterInstance, statuses: "list[HostStatus]"
) -> tuple[list[str], dict[str, str], dg.AssetCheckEvaluation]:
    """Observe every host that answered, then evaluate the drift check over every known host (runless); also
    which drifting hosts an interrupted install explains (host -> what to say)."""
    for status in statuses:
        if status.error is None:
            instance.report_runless_asset_event(status_observation(status))
    hosts = instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)
    drifted, evaluation = evaluate_drift(instance, hosts)
    instance.report_runless_asset_event(evaluation)
    live = {s.host_id: s.current for s in statuses if s.error is None}
    return drifted, interrupted_installs(instance, hosts, {h: live.get(h) for h in drifted}), evaluation


def interrupted_installs(
    instance: dg.DagsterInstance, order: Sequence[str], live: dict[str, str | None]
) -> dict[str, str]:
    """For each drifting host whose `current` names a deployment: the install run of that deployment over this
    host that ended failed or canceled since the host's last recorded install (killed or interrupted while
    activating, before it could record the host), described. Such a host moved under an operation of this
    tool, not outside it."""
    installed = latest_installs(instance, [h for h, d in live.items() if d])
    found: dict[str, str] = {}
    for host_id, deployment in live.items():
        if not deployment:
            continue
        last = installed.get(host_id)
        since = last.timestamp if last else 0.0
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=INSTALL_JOB, statuses=ENDED_BADLY,
                                                       tags={DEPLOYMENT_TAG: deployment}), limit=SCAN)  # fmt: skip
        for run in runs:
            start, end = run.tags.get(RANGE_START_TAG), run.tags.get(RANGE_END_TAG)
            if start in order and end in order and order.index(start) <= order.index(host_id) <= order.index(end):
                record = instance.get_run_record_by_id(run.run_id)
                if record is not None and (record.create_timestamp.timestamp() >= since):
                    found[host_id] = (f"an interrupted install: run {run.run_id} ({run.status.value.lower()}) moved "
                                      f"`current` to {deployment} before it could record this host; run the same "
                                      "install again to record it")  # fmt: skip
                    break
    return found


@dg.asset_check(
    asset=INSTALLATION,
    name=CHECK_NAME,
    description="Each host's live deployment (deploy-hosts status) is the one last installed there",
)
def live_matches_installed(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    _, found = evaluate_drift(context.instance, context.instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME))
    return as_result(found)

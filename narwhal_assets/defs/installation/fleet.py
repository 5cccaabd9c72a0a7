"""`fleet_install_job`: `deploy-hosts install` and `rollback` over many hosts as ONE run (`workflows/rollout`).

One process drives every selected host over its one SSH connection; each host is still its own
`host_installation` partition event: a materialization where `current` now names the deployment, an
observation where it was staged but not activated or failed (with outcome, revision, deployment id, bytes
and files sent, seconds, and `current` before and after). The run plans a materialization of every selected
partition before it starts, so when a host fails (the run fails) the UI shows exactly those partitions as
failed. Runs are tagged with the revision and deployment id: the run list answers "what went where".
A UI backfill of `host_installation` still works: one run per host (`__ASSET_JOB`).
"""


import getpass
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import dagster as dg
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.defs.installation.assets import outcome_metadata
from narwhal_assets.defs.installation.checks import evaluate_installed
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.names import COMMAND_TAG, FLEET_INSTALL_JOB
from narwhal_assets.defs.partitions import host_partitions
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.fleet_lock import FleetLock, LockRequest
from narwhal_assets.workflows.install import HostOutcome, InstallCommands, PreparedRun, open_prepared_run
from narwhal_assets.workflows.rollout import DEFAULT_PARALLEL, RolloutPlan, rollout, tracked

OP = "fleet_install"


class FleetInstallConfig(dg.Config):
    """`hosts`: partition keys (empty: every inventory host); `progress`: the in-process command's tracker."""

    run_dir: str
    mode: Literal["install", "activate"] = "install"
    hosts: list[str] = []
    activate: Literal["all", "each", "none"] = "all"
    canary: int = 0
    max_parallel: int = DEFAULT_PARALLEL
    message: str = ""
    progress: str = ""


class RolloutFailed(NarwhalError):
    """At least one host failed; every host's outcome is in the run's events and the command's Progress."""


@dg.op(name=OP, out={}, description="Stage the prepared run on every selected host, then activate (docs/install.md)")
def fleet_install(
    context: dg.OpExecutionContext, config: FleetInstallConfig, checkout: ManagementCheckout, ssh: SshSettings
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
    """Yields each host's event (stored at once), then evaluates the outdated-installation check."""
    opened = checkout.open()
    settings, inventory = opened.settings, opened.inventory
    run = open_prepared_run(settings, inventory, Path(config.run_dir))
    entries = [inventory.host(h) for h in config.hosts] if config.hosts else list(inventory.hosts)
    _plan_materializations(context, [e.id for e in entries])
    connector = ssh.connector(settings, TrustMode.STRICT)
    plan = RolloutPlan(config.mode, config.activate, config.canary, config.max_parallel)
    command = context.run.tags.get(COMMAND_TAG, "dagster")
    request = LockRequest(command, run.manifest.revision, run.manifest.deployment_id, config.message)
    progress = tracked(config.progress)
    with FleetLock(connector, settings, inventory, request) as lock:
        if lock.broken is not None:
            context.log.warning(f"took over the stale fleet lock of {lock.broken.describe()}")
            progress.broken = lock.broken
        outcomes = rollout(connector, settings, entries, run, InstallCommands.from_settings(settings), plan,
                           progress, before_activation=lock.check)  # fmt: skip
    who = f"{command} by {getpass.getuser()}"
    for outcome in outcomes:
        metadata = outcome_metadata(run, outcome, config.mode, who)
        said = f"{command}: {outcome.describe()}"  # tells an install, an activation and a status apart
        if outcome.current:
            yield dg.AssetMaterialization(INSTALLATION, partition=outcome.host_id, description=said, metadata=metadata)
        else:
            yield dg.AssetObservation(INSTALLATION, partition=outcome.host_id, description=said, metadata=metadata)
    yield dg.AssetObservation(INSTALLATION, description=f"fleet after {command} of {run.manifest.deployment_id}",
                              metadata={"fleet": fleet_table(run, entries, outcomes, command)})  # fmt: skip
    context.log_event(evaluate_installed(context.instance))
    failed = [o.host_id for o in outcomes if not o.ok]
    untouched = [e.id for e in entries if e.id not in {o.host_id for o in outcomes}]
    if failed:
        raise RolloutFailed(f"{len(failed)} of {len(entries)} hosts failed ({', '.join(failed)})"
                            + (f"; not contacted: {', '.join(untouched)}" if untouched else ""))  # fmt: skip


FLEET_COLUMNS = ["host", "roles", "current", "revision", "state", "last_action"]


def fleet_table(
    run: PreparedRun, entries: list[HostEntry], outcomes: list[HostOutcome], command: str
) -> dg.TableMetadataValue:
    """What runs where after this command, one short row per host (readable at 1280 px: 12-character ids;
    when is the event's own time)."""
    done = {o.host_id: o for o in outcomes}
    rows = []
    for entry in entries:
        outcome = done.get(entry.id)
        now = (outcome.current_after or outcome.current_before) if outcome else None
        revision = run.manifest.revision[:12] if outcome is not None and outcome.current else "?"
        state = outcome.activation if outcome and outcome.staged else (f"failed: {outcome.gate}" if outcome
                                                                       else "not contacted")  # fmt: skip
        rows.append(dg.TableRecord({"host": entry.id, "roles": ",".join(entry.roles), "current": (now or "none")[:12],
                                    "revision": revision, "state": state, "last_action": command}))
    return dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[dg.TableColumn(c) for c in FLEET_COLUMNS]))


def _plan_materializations(context: dg.OpExecutionContext, host_ids: list[str]) -> None:
    """Record that this run means to materialize these partitions, as an asset job's run does: a partition
    this run ends without materializing is then shown as failed (run failed) or untouched (run succeeded)."""
    subset = host_partitions.empty_subset().with_partition_keys(host_ids)
    event = DagsterEvent.build_asset_materialization_planned_event(
        context.job_name, str(context.op_handle),
        AssetMaterializationPlannedData(INSTALLATION, partitions_subset=subset),
    )  # fmt: skip
    context.instance.report_dagster_event(event, run_id=context.run_id)


@dg.job(name=FLEET_INSTALL_JOB, description="Install or roll back a prepared run on many hosts as one operation")
def fleet_install_job() -> None:
    fleet_install()

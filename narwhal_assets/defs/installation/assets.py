"""`host_installation`: one partition per physical host (`narwhal_hosts`); one run installs many as ONE operation.

Every entry point runs this asset, and so the same fleet operation (`workflows/rollout`: the lease on every
host, stage everywhere, then activate, canary): `deploy-hosts install` and `rollback` (a run over the selected
partitions), a UI backfill of any partitions (one run: `BackfillPolicy.single_run()`), the re-verification
schedule and `dagster asset materialize --partition` (a one-host operation under the same lease).

Each host's result is recorded as soon as that host is done, while the others still work: a materialization
of its partition where `current` now names the deployment, an observation where it was staged but not
activated, failed, or was left alone (with outcome, revision, deployment id, bytes and files sent, seconds,
and `current` before and after). The run fails when any host failed, so Dagster shows exactly the partitions
that this run meant to install and did not as *Failed*; a held-back host (another failed) is one of them.
Runs are tagged with the revision and deployment id: the run list answers "what went where".
"""


import getpass
import queue
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import dagster as dg

from narwhal_assets.core.errors import NarwhalError, RolloutFailed
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.prepared_run.manifest import PreparedRun
from narwhal_assets.defs.installation.checks import evaluate_installed
from narwhal_assets.defs.installation.prepared import checked_prepared_run
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, INSTALLATION
from narwhal_assets.defs.names import COMMAND_TAG, HOST_POOL, INSTALL_JOB
from narwhal_assets.defs.partitions import host_partitions
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.install import HostOutcome, InstallCommands, Mode, open_prepared_run
from narwhal_assets.workflows.lease import LeaseRequest, OperationLease, lease_seconds
from narwhal_assets.workflows.rollout import DEFAULT_PARALLEL, Progress, RolloutPlan, rollout

GROUP = "installation"
GRACE_S = 10.0  # after a cancel, how long host work under way may take to finish and be recorded


class InstallConfig(dg.Config):
    """`run_dir`: the prepared directory; empty means the latest `deployment_manifest` whose prepare checks all
    passed. `mode`: `install` (send what is missing, then make it current) or `activate` (rollback: make an
    installed, untampered deployment current again; nothing is sent). `hosts`: only these of the run's
    partitions (empty: all of them)."""

    run_dir: str = ""
    mode: Literal["install", "activate"] = "install"
    activate: Literal["all", "each", "none"] = "all"
    canary: int = 0
    max_parallel: int = DEFAULT_PARALLEL
    message: str = ""
    hosts: list[str] = []


with warnings.catch_warnings():
    # The single-run backfill policy is Dagster's beta API, and exactly what makes a UI backfill one operation.
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.asset(
        partitions_def=host_partitions,
        backfill_policy=dg.BackfillPolicy.single_run(),
        output_required=False,
        deps=[DEPLOYMENT_MANIFEST],
        group_name=GROUP,
        kinds={"ssh"},
        pool=HOST_POOL,
        description="`~/Narwhal-deploy/<deployment id>/` on each host of the run, made current as one fleet "
        "operation (lease, stage everywhere, then activate); docs/install.md",
    )
    def host_installation(
        context: dg.AssetExecutionContext,
        config: InstallConfig,
        checkout: ManagementCheckout,
        ssh: SshSettings,
        progress: dg.ResourceParam[Progress],
    ) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
        """Verify the manifest against the checkout (every host), then run the fleet operation over this run's
        partitions; each host's event as soon as it is done."""
        yield from install_fleet(context, config, checkout, ssh, progress)


def install_fleet(
    context: dg.AssetExecutionContext, config: InstallConfig, checkout: ManagementCheckout, ssh: SshSettings,
    progress: Progress,
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:  # fmt: skip
    if not (context.has_partition_key or context.has_partition_key_range):  # e.g. a selection of every asset
        raise NarwhalError("host_installation is partitioned by host: name the hosts (`--partition node-1`, a "
                           "backfill in the UI) or run `deploy-hosts install`")  # fmt: skip
    opened = checkout.open()
    settings, inventory = opened.settings, opened.inventory
    run_dir = checked_prepared_run(context.instance, Path(config.run_dir) if config.run_dir else None)
    run = open_prepared_run(settings, inventory, run_dir)
    keys = set(context.partition_keys)
    wanted = keys & set(config.hosts) if config.hosts else keys
    entries = [e for e in inventory.hosts if e.id in wanted]
    unknown = sorted(wanted - {e.id for e in entries})
    if unknown:
        raise NarwhalError(f"host_installation: partition {', '.join(unknown)} is not in the inventory "
                           f"{settings.hosts_path}")  # fmt: skip
    command = context.run.tags.get(COMMAND_TAG, "dagster")
    who = f"{command} by {getpass.getuser()}"
    for host_id in sorted(keys - wanted):  # in this run's partition range, not selected: left alone
        yield dg.AssetObservation(INSTALLATION, partition=host_id, description=f"{command}: not selected",
                                  metadata={"outcome": "not selected", "who": who})  # fmt: skip
    plan = RolloutPlan(config.mode, config.activate, config.canary, config.max_parallel)
    lease = OperationLease(LeaseRequest(command, run.manifest.revision, run.manifest.deployment_id, config.message),
                           lease_seconds(settings))  # fmt: skip
    done: queue.Queue[HostOutcome] = queue.Queue()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            connector = ssh.connector(settings, TrustMode.STRICT)
            commands = InstallCommands.from_settings(settings)
            rollout(connector, settings, entries, run, commands, plan, lease, progress, done.put, progress.cancel)
        except BaseException as exc:  # handed to the step's thread as it is
            failure.append(exc)

    worker = threading.Thread(target=work, name="narwhal-fleet", daemon=True)
    progress.recorded.clear()
    worker.start()
    try:
        while worker.is_alive() or not done.empty():
            try:
                outcome = done.get(timeout=0.2)
            except queue.Empty:
                continue
            yield _host_event(run, outcome, config.mode, who, command)
    except BaseException:  # interrupted (the run terminated): stop starting host work, record what finishes
        progress.cancel.set()
        worker.join(GRACE_S)
        while not done.empty():
            yield _host_event(run, done.get(), config.mode, who, command)
        raise
    finally:
        progress.recorded.set()
    if failure:
        raise failure[0]
    outcomes = [progress.outcomes[e.id] for e in entries if e.id in progress.outcomes]
    for host_id, holder in sorted(lease.broken.items()):
        context.log.warning(f"host {host_id}: took over the expired lease of {holder.describe()}")
    yield dg.AssetObservation(INSTALLATION, description=f"fleet after {command} of {run.manifest.deployment_id}",
                              metadata={"fleet": fleet_table(run, entries, outcomes, command)})  # fmt: skip
    context.log_event(evaluate_installed(context.instance))
    failed = [o.host_id for o in outcomes if not o.ok]
    untouched = [e.id for e in entries if e.id not in progress.outcomes]
    if failed or untouched:
        raise RolloutFailed(f"{len(failed)} of {len(entries)} hosts failed" + (f" ({', '.join(failed)})" if failed
                            else "") + (f"; not staged: {', '.join(untouched)}" if untouched else ""))  # fmt: skip


def _host_event(
    run: PreparedRun, outcome: HostOutcome, mode: Mode, who: str, command: str
) -> dg.AssetMaterialization | dg.AssetObservation:
    metadata = outcome_metadata(run, outcome, mode, who)
    said = f"{command}: {outcome.describe()}"  # tells an install, an activation and a status apart
    if outcome.current and outcome.ok:
        return dg.AssetMaterialization(INSTALLATION, partition=outcome.host_id, description=said, metadata=metadata)
    return dg.AssetObservation(INSTALLATION, partition=outcome.host_id, description=said, metadata=metadata)


def outcome_metadata(run: PreparedRun, outcome: HostOutcome, mode: Mode, who: str) -> dict[str, Any]:
    """What the UI shows per host; names and counts only, never a destination or password."""
    return {
        "outcome": _outcome_word(outcome, mode),
        "mode": mode,
        "who": who,
        "current": outcome.activation,
        "current_before": outcome.current_before or "none",
        "current_after": outcome.current_after or outcome.current_before or "none",
        "summary": outcome.describe(),
        "revision": run.manifest.revision,
        "deployment_id": run.manifest.deployment_id,
        "remote_dir": f"~/{run.manifest.remote_dir}",
        "run_dir": dg.MetadataValue.path(str(run.run_dir)),
        "log": dg.MetadataValue.path(str(run.log_path(outcome.host_id))),
        "bytes_sent": outcome.bytes_sent,
        "files_sent": outcome.files_sent,
        "files_verified": outcome.files_verified,
        "seconds": round(outcome.seconds, 3),
        **({"message": outcome.message} if outcome.message else {}),
    }


def _outcome_word(outcome: HostOutcome, mode: Mode) -> str:
    """`installed`, `reused`, `activated` (by a rollback), `staged` (not activated) or `failed: <gate>`."""
    if not outcome.ok:
        return f"failed: {outcome.gate}"
    if outcome.activation == "not activated":
        return "staged"
    return "activated" if mode == "activate" else outcome.outcome


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
                                                                       else "not staged")  # fmt: skip
        rows.append(dg.TableRecord({"host": entry.id, "roles": ",".join(entry.roles), "current": (now or "none")[:12],
                                    "revision": revision, "state": state, "last_action": command}))
    return dg.MetadataValue.table(rows, schema=dg.TableSchema(columns=[dg.TableColumn(c) for c in FLEET_COLUMNS]))


install_job = dg.define_asset_job(
    INSTALL_JOB,
    # the outdated-installation check is evaluated by the asset itself once every host is recorded; the
    # live-deployment check is not: it compares with the last `status` observation, which an install has just
    # made stale
    selection=dg.AssetSelection.assets(INSTALLATION).without_checks(),
    description="Install (or roll back) the prepared run on the selected hosts as one fleet operation",
)

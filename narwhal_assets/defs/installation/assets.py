"""`host_installation`: one partition per physical host (`narwhal_hosts`), installing a prepared run there.

A partition's materialization records the revision, deployment id, remote directory, outcome (`installed`,
`reused`, or `activated` by a rollback), who started it, bytes and files sent, files verified and seconds, so
the partition's history is the audit log of what ran where; a failing host records the same as an
observation naming its gate, then fails its run, so the UI shows every host's state and a re-run (or a
backfill over all partitions) retries it.
"""

import getpass
from pathlib import Path
from typing import Literal

import dagster as dg

from narwhal_assets.defs.deployment.assets import latest_out
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, INSTALLATION, OUTDATED_CHECK
from narwhal_assets.defs.names import COMMAND_TAG, INSTALL_JOB
from narwhal_assets.defs.partitions import host_partitions
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.install import (
    HostInstallFailure,
    HostOutcome,
    InstallCommands,
    Mode,
    PreparedRun,
    connect_and_install,
    open_prepared_run,
)

GROUP = "installation"


class InstallConfig(dg.Config):
    """`run_dir`: the prepared directory; empty means the latest `deployment_manifest` materialization's (lineage).
    `mode`: `install` (send what is missing, then make it current) or `activate` (rollback: make an installed,
    untampered deployment current again; nothing is sent)."""

    run_dir: str = ""
    mode: Literal["install", "activate"] = "install"


@dg.asset(
    partitions_def=host_partitions,
    deps=[DEPLOYMENT_MANIFEST],
    group_name=GROUP,
    kinds={"ssh"},
    description="`~/Narwhal-deploy/<deployment id>/` on one host: the prepared run installed and verified",
)
def host_installation(
    context: dg.AssetExecutionContext, config: InstallConfig, checkout: ManagementCheckout, ssh: SshSettings
) -> dg.MaterializeResult:
    """Verify the manifest against the checkout (every host), then install on this partition's host."""
    opened = checkout.open()
    settings, inventory = opened.settings, opened.inventory
    run_dir = Path(config.run_dir) if config.run_dir else latest_out(context.instance, DEPLOYMENT_MANIFEST)[0]
    run = open_prepared_run(settings, inventory, run_dir)
    entry = inventory.host(context.partition_key)
    connector = ssh.connector(settings, TrustMode.STRICT)
    commands = InstallCommands.from_settings(settings)
    mode: Mode = config.mode
    outcome = connect_and_install(connector, host_access(settings, entry), run, commands, mode)
    who = f"{context.run.tags.get(COMMAND_TAG, 'dagster')} by {getpass.getuser()}"
    metadata = outcome_metadata(run, outcome, mode, who)
    if not outcome.ok:
        context.log_event(dg.AssetObservation(asset_key=INSTALLATION, partition=entry.id, metadata=metadata))
        raise HostInstallFailure(entry.id, outcome.gate or "unknown", outcome.message or "", outcome)
    context.log.info(f"host {entry.id}: {outcome.describe()}")
    return dg.MaterializeResult(metadata=metadata)


def outcome_metadata(run: PreparedRun, outcome: HostOutcome, mode: Mode, who: str) -> dict[str, object]:
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


install_job = dg.define_asset_job(
    INSTALL_JOB,
    # the outdated-installation check runs after each host (non-blocking); the live-deployment check does not:
    # it compares with the last `status` observation, which an install has just made stale
    selection=dg.AssetSelection.assets(INSTALLATION).without_checks() | dg.AssetSelection.checks(OUTDATED_CHECK),
    partitions_def=host_partitions,
    description="Install the prepared run on the selected hosts (one partition per physical host)",
)

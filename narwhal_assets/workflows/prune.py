"""`deploy-hosts prune`: removing old deployment directories on hosts and prepared runs no host holds any more.

The plan comes from a status of the selected hosts (`workflows/status.py`; the pure rules are in
`core.deployment.prune`). Each host removes under the prune's lease, taken and released in the same call, and
re-checks `current` and the deployments' locks under it: no install or rollback moves `current` on a host while
prune removes there. The workstation removes prepared runs only after a status of every host, since only that
tells which runs are unused.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from narwhal_assets.core.deployment.prune import (
    HostDirectory,
    PreparedRunInfo,
    host_directories_to_remove,
    prepared_runs_to_remove,
)
from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import REMOTE_BASE, PreparedRun
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.protocols.install import InstallReport, terminal_safe
from narwhal_assets.ssh.access import host_access, make_connector
from narwhal_assets.ssh.transport import Connector
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.install import acquire_and_call
from narwhal_assets.workflows.lease import LeaseRequest, OperationLease, lease_seconds
from narwhal_assets.workflows.status import HostStatus, read_hosts, short


@dataclass
class PruneResult:
    """What one prune removed (on a dry run: would remove), and why it exits 1."""

    removed: dict[str, list[str]]  # host id -> deployment directories
    workstation: list[PreparedRun]
    problems: list[str]  # one per host not read or not pruned, each starting `host <id>: `


def prune(
    root: Path,
    host_ids: Sequence[str],
    roles: Sequence[str],
    keep: int,
    *,
    dry_run: bool,
    say: Callable[[str], None],
) -> PruneResult:
    """Plan from a status of the selected hosts, prune each host in turn, then the workstation's prepared runs.
    One strict connector reads and prunes every host; `say` gets each line as it happens
    (what goes, what a host kept and why), since a prune over many hosts takes a while."""
    if keep < 1:  # before the checkout is read: bad input answers at once
        raise InputError(["--keep: must be 1 or more"])
    checkout = Checkout.open(root)
    entries = checkout.select(host_ids, roles)
    connector = make_connector(checkout.settings, TrustMode.STRICT)
    statuses, runs = read_hosts(checkout, entries, connector)
    plans = {s.host_id: host_prune_plan(s, keep) for s in statuses if s.error is None}
    problems = [f"host {s.host_id}: {s.error}" for s in statuses if s.error is not None]
    verb = "would remove" if dry_run else "removing"
    for s in statuses:
        for name in plans.get(s.host_id, []):
            entry = s.entry(name)
            say(f"  {s.host_id:<10} {verb} ~/{REMOTE_BASE}/{name} ({entry.state if entry else '?'}, revision "
                f"{short(entry.revision if entry else None)})")  # fmt: skip
    removed, failed = (dict(plans), []) if dry_run else _prune_hosts(connector, checkout.settings, entries, plans, say)
    problems += failed
    every_host = not host_ids and not roles
    doomed = workstation_prune_plan(runs, keep, statuses, removed) if every_host and not problems else []
    for run in doomed:
        say(f"  workstation {verb} {run.run_dir} (deployment {run.manifest.deployment_id})")
        if not dry_run:
            remove_prepared_run(run)
    if not every_host or problems:
        say("  workstation: prepared runs kept (only a status of every host tells which are unused)")
    return PruneResult(removed, doomed, problems)


def _prune_hosts(
    connector: Connector,
    settings: Settings,
    entries: list[HostEntry],
    plans: dict[str, list[str]],
    say: Callable[[str], None],
) -> tuple[dict[str, list[str]], list[str]]:
    """Each host with something to remove, one at a time, under the lease: what each removed, and one problem
    per host that failed (it keeps everything; the others go on)."""
    by_id = {e.id: e for e in entries}
    lease = OperationLease(LeaseRequest("prune"), lease_seconds(settings))
    removed: dict[str, list[str]] = {}
    failed: list[str] = []
    for host_id, plan in plans.items():
        if not plan:
            continue
        try:
            with lease.active():
                report = prune_host(connector, settings, by_id[host_id], plan, lease)
        except NarwhalError as exc:
            failed.append(f"host {host_id}: prune failed: {terminal_safe(str(exc))}")
            continue
        removed[host_id] = list(report.removed)
        for name, reason in report.kept.items():
            say(f"  {host_id:<10} kept ~/{REMOTE_BASE}/{name}: {reason}")
    return removed, failed


def host_prune_plan(status: HostStatus, keep: int) -> list[str]:
    """What `prune --keep` removes on this host (the host re-checks current and locks before it does)."""
    directories = [HostDirectory(d.name, d.state, d.installed_at, d.name == status.current)
                   for d in status.deployments]  # fmt: skip
    return host_directories_to_remove(directories, keep)


def prune_host(
    connector: Connector, settings: Settings, entry: HostEntry, remove: list[str], lease: OperationLease
) -> InstallReport:
    """One call that takes the operation's lease on the host, removes under it, and releases it: a host whose
    lease another operation holds is refused (gate `lease`) and keeps everything."""
    with connector.connect(host_access(settings, entry)) as connection:
        return acquire_and_call(connection, None, {"remote_base": REMOTE_BASE, "action": "prune", "remove": remove},
                                lease, "after")  # fmt: skip


def workstation_prune_plan(
    runs: Sequence[PreparedRun], keep: int, statuses: Sequence[HostStatus], removed: dict[str, list[str]]
) -> list[PreparedRun]:
    """Prepared runs to delete: not among the newest `keep`, their deployment left on no host (after the
    host removals in `removed`), not `current` anywhere. Nothing while a host's status is unknown."""
    if any(s.error is not None or s.truncated for s in statuses):
        return []
    present = {d.name for s in statuses for d in s.deployments if d.name not in removed.get(s.host_id, [])}
    current = {s.current for s in statuses if s.current}
    infos = [PreparedRunInfo(str(r.run_dir), r.manifest.deployment_id, r.manifest.created_at) for r in runs]
    names = set(prepared_runs_to_remove(infos, keep, present, current))
    return [r for r in runs if str(r.run_dir) in names]


def remove_prepared_run(run: PreparedRun) -> None:
    shutil.rmtree(run.run_dir)

"""Which deployment each host runs, and removing old ones (`deploy-hosts status` / `prune`).

`status` is one strict connection per host running the installer's read-only `status` action: every entry of
`~/Narwhal-deploy/`, which one `current` names, and for each deployment this workstation prepared (its file
list is in that run's manifest) whether the host's files still match. `prune` plans from that status (pure
rule in `core.deployment.prune`) and lets each host re-check under its lease and locks before removing
anything. Rollback is `install_job` in `activate` mode (`install.activate_host`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from narwhal_assets.core.deployment.manifest import MANIFEST_FILE, REMOTE_BASE, PreparedRun
from narwhal_assets.core.deployment.manifest_check import load_manifest
from narwhal_assets.core.deployment.prune import (
    HostDirectory,
    PreparedRunInfo,
    host_directories_to_remove,
    prepared_runs_to_remove,
)
from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import HostInstallFailure, InputError, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.protocols.install import MESSAGE_LIMIT, DeploymentEntry, Gate, InstallReport
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.parallel import HOSTS_AT_ONCE, over_hosts
from narwhal_assets.ssh.transport import Connector
from narwhal_assets.workflows.install import acquire_and_call, call_installer, install_files
from narwhal_assets.workflows.lease import OperationLease

RUNS_LIMIT = 1000  # prepared runs read from the workstation's deployment directory
PARALLEL = HOSTS_AT_ONCE


@dataclass
class HostStatus:
    """One host's `~/Narwhal-deploy/` as its `status` action reported it, or why it could not be read."""

    host_id: str
    roles: list[str]
    current: str | None = None
    deployments: list[DeploymentEntry] = field(default_factory=list)
    truncated: bool = False
    error: str | None = None  # why it could not be read, without the `host <id>: ` every problem line adds
    # When the read began: an install committed after it moved `current` itself (not drift).
    read_started_at: float = field(default_factory=time.time)

    def entry(self, name: str | None) -> DeploymentEntry | None:
        return next((d for d in self.deployments if d.name == name), None)

    @property
    def live(self) -> DeploymentEntry | None:
        """The deployment `current` names, when it is there."""
        return self.entry(self.current)

    def problems(self) -> list[str]:
        """One line per thing the operator must look at (exit 1): unreachable, tampered, a broken `current`."""
        if self.error is not None:
            return [f"host {self.host_id}: {self.error}"]
        found = [f"host {self.host_id}: {REMOTE_BASE}/{d.name}: {d.problem}" for d in self.deployments
                 if d.check == "tampered"]  # fmt: skip
        if self.current == "":
            found.append(f"host {self.host_id}: {REMOTE_BASE}/current is not a symlink to a deployment")
        elif self.current is not None and (self.live is None or self.live.state not in ("installed", "locked")):
            found.append(f"host {self.host_id}: {REMOTE_BASE}/current names {self.current}, which is not an "
                         "installed deployment there")  # fmt: skip
        if self.truncated:
            found.append(f"host {self.host_id}: {REMOTE_BASE} holds more entries than status lists")
        return found

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host_id, "roles": self.roles, "current": self.current, "error": self.error,
                "truncated": self.truncated, "problems": self.problems(),
                "deployments": [d.model_dump() for d in self.deployments]}  # fmt: skip


def prepared_runs(settings: Settings) -> list[PreparedRun]:
    """Prepared runs under `NARWHAL_DEPLOYMENT_ENV_DIR` with a readable manifest (others are not ours to judge)."""
    top = settings.deployment_env_dir
    found = []
    for run_dir in sorted(top.iterdir())[:RUNS_LIMIT] if top.is_dir() else []:
        if run_dir.is_dir() and not run_dir.is_symlink() and (run_dir / MANIFEST_FILE).is_file():
            try:
                found.append(PreparedRun(run_dir, load_manifest(run_dir)))
            except InputError:
                continue
    return found


def known_deployments(host_id: str, runs: Sequence[PreparedRun]) -> dict[str, dict[str, Any]]:
    """deployment id -> the revision and file list the installer verifies that directory against."""
    known = {}
    for run in runs:
        host = next((h for h in run.manifest.hosts if h.id == host_id), None)
        if host is not None:
            files = install_files(host, run.manifest.bundle)
            known[run.manifest.deployment_id] = {"revision": run.manifest.revision,
                                                 "files": [f.model_dump() for f, _ in files]}  # fmt: skip
    return known


def call_host(connector: Connector, settings: Settings, entry: HostEntry, params: dict[str, Any]) -> InstallReport:
    """One strict connection, one read-only or pruning installer action; failures are `NarwhalError`s."""
    with connector.connect(host_access(settings, entry)) as connection:
        return call_installer(connection, None, {"remote_base": REMOTE_BASE, **params}, [])


def host_status(
    connector: Connector, settings: Settings, entry: HostEntry, runs: Sequence[PreparedRun]
) -> HostStatus:
    status = HostStatus(entry.id, list(entry.roles))
    try:
        report = call_host(connector, settings, entry, {"action": "status", "known": known_deployments(entry.id, runs)})
    except HostInstallFailure as exc:  # it answered: with a gate, or with something that is not a report
        answered = "answered without an installer report" if exc.gate == Gate.REPORT else f"failed at gate {exc.gate}"
        status.error = printable(f"{answered}: {exc.message}", MESSAGE_LIMIT)
        return status
    except NarwhalError as exc:  # the connection's own message names the host already
        text = str(exc)
        status.error = printable(text.removeprefix(f"host {entry.id} ").removeprefix(f"host {entry.id}: "),
                                 MESSAGE_LIMIT)  # fmt: skip
        return status
    status.current, status.deployments, status.truncated = report.current, report.deployments, report.truncated
    return status


def fleet_status(
    connector: Connector, settings: Settings, entries: Sequence[HostEntry], runs: Sequence[PreparedRun]
) -> list[HostStatus]:
    """Every selected host's status, several at once (one connection each), in inventory order."""
    return over_hosts(entries, lambda entry: host_status(connector, settings, entry, runs), PARALLEL)


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

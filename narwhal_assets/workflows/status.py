"""`deploy-hosts status`: which deployment each host runs, read over one strict connection per host.

Each host runs the installer's read-only `status` action: every entry of `~/Narwhal-deploy/`, which one
`current` names, and for each deployment this workstation prepared (its file list is in that run's manifest)
whether the host's files still match. `prune` plans from the same reading (`workflows/prune.py`); recording it
in Dagster is `defs/installation/status.py`, since no workflow imports Dagster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import HostInstallFailure, InputError, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import MANIFEST_FILE, REMOTE_BASE, PreparedRun
from narwhal_assets.core.prepared_run.manifest_check import load_manifest
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.protocols.install import MESSAGE_LIMIT, DeploymentEntry, Gate, InstallReport
from narwhal_assets.ssh.access import host_access, make_connector
from narwhal_assets.ssh.parallel import HOSTS_AT_ONCE, over_hosts
from narwhal_assets.ssh.transport import Connector
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.install import call_installer, install_files

RUNS_LIMIT = 1000  # prepared runs read from the workstation's runs/deployment-env/
PARALLEL = HOSTS_AT_ONCE
SHORT = 12  # characters of a deployment id or revision in a table or a prune line


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
    """One strict connection, one installer action that takes no lease; failures are `NarwhalError`s."""
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


def read_hosts(
    checkout: Checkout, entries: list[HostEntry], connector: Connector | None = None
) -> tuple[list[HostStatus], list[PreparedRun]]:
    """Every selected host's status (over `connector`, else a strict one with the transport's own bounds)
    and the workstation's prepared runs."""
    connector = connector or make_connector(checkout.settings, TrustMode.STRICT)
    runs = prepared_runs(checkout.settings)
    return fleet_status(connector, checkout.settings, entries, runs), runs


def short(value: str | None) -> str:
    return (value or "-")[:SHORT]

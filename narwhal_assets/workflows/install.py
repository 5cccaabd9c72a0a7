"""One host's part of a fleet operation: the calls `rollout` makes to it, over its connection.

Per host: `inspect` (read-only, and it takes the operation's lease there; `reused` when the marker names the
revision and everything verifies, so nothing is sent), else `install` with only the files the host lacks,
which verifies what it built and writes the completion marker last; then, once the fleet may move,
`activate` points `current` at it and releases the lease. Every call is logged in `<run>/logs/<host-id>.log`
(`host_log`).
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from narwhal_assets.core.errors import HostInstallFailure, InputError, NarwhalError, ReportError
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import BUNDLE_FILE, ManifestHost, PreparedFile, PreparedRun
from narwhal_assets.core.prepared_run.manifest_check import (
    CurrentAccess,
    destination_sha256,
    load_manifest,
    remote_name,
    verify_manifest,
)
from narwhal_assets.core.prepared_run.role_env import RoleSources
from narwhal_assets.core.prepared_run.staleness import changed_settings
from narwhal_assets.host import program_stream
from narwhal_assets.local.checkout import missing_run_problem
from narwhal_assets.local.privatefiles import non_private
from narwhal_assets.protocols.install import (
    INSTALLER,
    Gate,
    InstallFile,
    InstallReport,
    installer_program,
    installer_script,
    parse_install_report,
    terminal_safe,
)
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.transport import HostConnection
from narwhal_assets.ssh.trust import KnownHostsStore
from narwhal_assets.workflows.host_log import HostLog
from narwhal_assets.workflows.lease import OperationLease, call_lease

DEFAULT_INSTALL = "python -m pip install -e ."
DEFAULT_CHECK = "python -m pip check"


@dataclass(frozen=True)
class InstallCommands:
    """The install and check commands run in `checkout/` with `.venv` active (`NARWHAL_REMOTE_INSTALL/CHECK`)."""

    install: str = DEFAULT_INSTALL
    check: str = DEFAULT_CHECK

    @classmethod
    def from_settings(cls, settings: Settings) -> InstallCommands:
        return cls(
            settings.get("NARWHAL_REMOTE_INSTALL") or DEFAULT_INSTALL,
            settings.get("NARWHAL_REMOTE_CHECK") or DEFAULT_CHECK,
        )


Mode = Literal["install", "activate"]
# What staging found or did: the deployment was sent and completed (`installed`), or was already complete
# (`reused`); `failed` at a named gate otherwise.
OK_OUTCOMES = ("installed", "reused")
# What then happened to `current`: `activated` (moved here), `already current`, `not activated` (see `why`).
Activation = Literal["activated", "already current", "not activated", "failed"]


@dataclass
class HostOutcome:
    """What happened on one host: staging's outcome, then what happened to `current` (before and after)."""

    host_id: str
    outcome: str = "failed"
    gate: str | None = None
    message: str | None = None
    bytes_sent: int = 0
    files_sent: int = 0
    files_verified: int = 0
    seconds: float = 0.0
    remote_dir: str = ""
    deployment_id: str = ""
    current_before: str | None = None
    current_after: str | None = None
    activation: Activation = "not activated"
    why: str = ""
    mode: Mode = "install"
    notes: list[str] = field(default_factory=list)  # the installer's, e.g. a stale lock it took over

    @property
    def ok(self) -> bool:
        """Staged (or found complete) and, unless it was held back on purpose, made current."""
        return self.outcome in OK_OUTCOMES and self.activation != "failed"

    @property
    def staged(self) -> bool:
        return self.outcome in OK_OUTCOMES

    @property
    def current(self) -> bool:
        return self.activation in ("activated", "already current")

    def describe(self) -> str:
        """`installed, activated (was <id>)`, `reused, already current`, `staged, not activated (<why>)`, ...;
        then what else the installer did."""
        return self._what() + "".join(f"; {note}" for note in self.notes)

    def _what(self) -> str:
        if not self.staged or self.activation == "failed":
            return f"failed at gate {self.gate!r}: {self.message}"
        sent = f"{self.files_sent} files, {self.bytes_sent} bytes sent; {self.seconds:.2f} s"
        if self.activation == "not activated":
            return f"staged, not activated ({self.why or 'not asked to'}; {sent})"
        was = f" (was {self.current_before or 'none'})" if self.activation == "activated" else ""
        if self.mode == "activate":  # a rollback: staging only verified what was there
            return f"{self.activation}{was} (verified, {self.seconds:.2f} s)"
        return f"{self.outcome}, {self.activation}{was} ({sent})"


def open_prepared_run(settings: Settings, inventory: Inventory, run_dir: Path) -> PreparedRun:
    """Load and verify `<run>/manifest.json` against the current inventory, `.env`, trust store and files."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise InputError([missing_run_problem(settings, run_dir)])
    loose = non_private([run_dir])  # another user could have edited what would be installed
    if loose:
        raise InputError([f"{line}; prepare a new run" for line in loose])
    manifest = load_manifest(run_dir)
    verify_manifest(run_dir, manifest, inventory, current_access(settings, inventory))
    return PreparedRun(run_dir, manifest)


def stale_settings(settings: Settings, run: PreparedRun) -> list[str]:
    """The settings changed since `run` was prepared (names only): installing it ships their old values.
    Read from `sources.json` alone (value digests), not from the role files."""
    if run.manifest.sources is None:
        return []
    sources = RoleSources.model_validate_json((run.run_dir / run.manifest.sources.path).read_bytes())
    return changed_settings(sources, settings)


def current_access(settings: Settings, inventory: Inventory) -> dict[str, CurrentAccess]:
    """Per host: the digest of its destination now and the keys the store pins for where it resolves."""
    store = KnownHostsStore(settings.known_hosts_path)
    current = {}
    for entry in inventory.hosts:
        destination = settings.get(entry.ssh_env)
        if not destination:
            current[entry.id] = CurrentAccess(None, ())
            continue
        endpoint = resolve_endpoint(destination, settings.ssh_config_path)
        fingerprints = tuple(store.fingerprints(*endpoint.known_host))
        current[entry.id] = CurrentAccess(destination_sha256(destination), fingerprints)
    return current


def install_files(host: ManifestHost, bundle: PreparedFile) -> list[tuple[InstallFile, PreparedFile]]:
    """The bundle and the host's files, as the installer names them, with where each is on the workstation."""
    files = [(InstallFile(name=BUNDLE_FILE, sha256=bundle.sha256, size=bundle.size), bundle)]
    for prepared in host.files:
        installer_file = InstallFile(
            name=remote_name(host.id, prepared), sha256=prepared.sha256, size=prepared.size,
            install_to=prepared.install_to, keep_if_present=prepared.keep_if_present,
        )  # fmt: skip
        files.append((installer_file, prepared))
    return files


def connection_failed(host_id: str, run: PreparedRun, exc: NarwhalError, began: float) -> HostOutcome:
    """The outcome of a host whose connection could not be made (logged in its host log)."""
    outcome = HostOutcome(host_id, gate=Gate.CONNECTION.value, message=terminal_safe(str(exc)), deployment_id=
                          run.manifest.deployment_id, remote_dir=run.manifest.remote_dir,
                          seconds=time.monotonic() - began)  # fmt: skip
    HostLog.open(run.log_path(host_id)).note(f"outcome: {outcome.describe()}")
    return outcome


def installer_params(run: PreparedRun, host_id: str, commands: InstallCommands | None = None) -> dict[str, Any]:
    """What every installer action on this host's deployment is told (the commands only for `install`)."""
    files = install_files(run.manifest.host(host_id), run.manifest.bundle)
    return {
        "remote_dir": run.manifest.remote_dir,
        "revision": run.manifest.revision,
        "files": [f.model_dump() for f, _ in files],
        "owner": f"deploy-hosts from {socket.gethostname()} ({run.run_dir.name})",
        **({"install_command": commands.install, "check_command": commands.check} if commands else {}),
    }


def inspect_host(
    connection: HostConnection, run: PreparedRun, mode: Mode, lease: OperationLease, release_when_current: bool
) -> tuple[HostOutcome, InstallReport | None]:
    """The host's first call: take the operation's lease there and look (read-only): which files it has, and
    whether the deployment is complete and verified (`reused`). With `release_when_current`, a host where it
    is complete and already current is released at once: the operation has nothing to do there. In
    `activate` mode (rollback) the deployment must already be complete and untampered there."""
    outcome = HostOutcome(connection.host_id, remote_dir=run.manifest.remote_dir, mode=mode,
                          deployment_id=run.manifest.deployment_id)  # fmt: skip
    log = HostLog.open(run.log_path(connection.host_id))
    release = "when_current" if release_when_current else "never"
    params = {**installer_params(run, connection.host_id), "action": "inspect"}
    try:
        report = acquire_and_call(connection, log, params, lease, release)
    except NarwhalError as exc:
        _failed(outcome, exc, log)
        return outcome, None
    outcome.files_verified, outcome.current_before = report.files_verified, report.current
    if report.outcome == "reused":
        outcome.outcome = "reused"
    elif mode == "activate":
        state = "is not on this host" if report.outcome == "absent" else "is incomplete there"
        outcome.gate = (Gate.ABSENT if report.outcome == "absent" else Gate.MARKER).value
        outcome.message = f"~/{run.manifest.remote_dir} {state}: run deploy-hosts install --run {run.run_dir}"
    return outcome, report


def stage_host(
    connection: HostConnection, run: PreparedRun, commands: InstallCommands, outcome: HostOutcome,
    inspected: InstallReport, lease: OperationLease,
) -> None:  # fmt: skip
    """Phase 1 on one host that is not complete yet, `current` untouched: send what it lacks and `install`,
    which verifies what it built and ends with the marker (under the lease). Stops at the first failing gate."""
    began = time.monotonic()
    host = run.manifest.host(outcome.host_id)
    log = HostLog.open(run.log_path(host.id))
    try:
        files = install_files(host, run.manifest.bundle)
        send = [(f, p) for f, p in files if inspected.files.get(f.name) != "present"]
        payloads = [_read_pinned(host.id, run.run_dir, p) for _, p in send]
        outcome.bytes_sent = sum(len(p) for p in payloads)
        params = {**installer_params(run, host.id, commands), "action": "install", "send": [f.name for f, _ in send],
                  "lease": lease.params("hold")}  # fmt: skip
        report = call_installer(connection, log, params, payloads, lease)
        outcome.files_sent, outcome.files_verified = report.files_received, report.files_verified
        outcome.notes += report.notes
        outcome.outcome = "installed"
    except NarwhalError as exc:
        _failed(outcome, exc, log)
    outcome.seconds += time.monotonic() - began
    log.note(f"staged: {outcome.describe()}")


def activate_host(connection: HostConnection, run: PreparedRun, outcome: HostOutcome, lease: OperationLease) -> None:
    """Phase 2 on one staged host: point `current` at the deployment (the installer verifies everything
    again under the deployment's lock, then switches under the lease), unless it already points there; the
    lease is released either way."""
    began = time.monotonic()
    log = HostLog.open(run.log_path(outcome.host_id))
    if outcome.current_before == run.manifest.deployment_id:
        outcome.activation, outcome.current_after = "already current", outcome.current_before
        release_lease(connection, outcome, lease, log)
    else:
        params = {**installer_params(run, outcome.host_id), "action": "activate",
                  "lease": lease.params("hold", "after")}  # fmt: skip
        try:
            report = call_installer(connection, log, params, [], lease)
            outcome.notes += report.notes
            outcome.activation, outcome.current_after = "activated", run.manifest.deployment_id
        except NarwhalError as exc:
            outcome.activation = "failed"
            _failed(outcome, exc, log)
    outcome.seconds += time.monotonic() - began
    log.note(f"outcome: {outcome.describe()}")


def release_lease(connection: HostConnection, outcome: HostOutcome, lease: OperationLease, log: HostLog) -> None:
    """The host needs nothing more: give its lease back (a failure only notes it: the lease runs out)."""
    asked = time.monotonic()
    try:
        report = call_lease(connection, "release", lease.params("hold"))
    except NarwhalError as exc:
        log.note(f"lease not released ({terminal_safe(str(exc))}); it runs out on its own")
        return
    lease.record(outcome.host_id, report, asked)


def hold_back(outcomes: list[HostOutcome], why: str) -> None:
    """Staged hosts left where `current` was (another host failed, or `--activate none`)."""
    for outcome in outcomes:
        if outcome.staged and outcome.current_before == outcome.deployment_id:
            outcome.activation, outcome.current_after = "already current", outcome.current_before
        elif outcome.staged:
            outcome.activation, outcome.why, outcome.current_after = "not activated", why, outcome.current_before


def _failed(outcome: HostOutcome, exc: NarwhalError, log: HostLog | None) -> None:
    """A gate the host named, or a connection that failed under the installer."""
    if isinstance(exc, HostInstallFailure):
        outcome.gate, outcome.message = exc.gate, exc.message
        return
    outcome.gate, outcome.message = Gate.CONNECTION.value, terminal_safe(str(exc))
    if log is not None:
        log.note(f"connection failure: {outcome.message}")


def acquire_and_call(
    connection: HostConnection, log: HostLog | None, params: dict[str, Any], lease: OperationLease, release: str
) -> InstallReport:
    """An installer call that takes the operation's lease on the host first; when an operation of this
    workstation that no longer runs holds it (killed, or ended while the host was down), once more, taking
    that lease over."""
    try:
        return call_installer(connection, log, {**params, "lease": lease.params("acquire", release)}, [], lease)
    except HostInstallFailure as failure:
        gone = lease.dead_holder(connection.host_id) if failure.gate == Gate.LEASE.value else None
        if gone is None:
            raise
    return call_installer(connection, log, {**params, "lease": lease.params("acquire", release, gone)}, [], lease)


def call_installer(
    connection: HostConnection, log: HostLog | None, params: dict[str, Any], payloads: list[bytes],
    lease: OperationLease | None = None,
) -> InstallReport:  # fmt: skip
    """One installer run; bounded by the connector's command timeout (`SshSettings.command_timeout_s`).
    Without a log (read-only `status`), nothing is written on the workstation. What the host said of the
    operation's lease is recorded in `lease`."""
    script = installer_script(params)
    if log is not None:
        log.call(params["action"], installer_program(params), params)
    asked = time.monotonic()
    result = connection.run_program(INSTALLER, program_stream(script, payloads))
    try:
        report = parse_install_report(result.stdout)
    except ReportError as exc:
        if log is not None:
            log.result(result.rc, result.stdout, result.stderr, None)
        detail = f"{exc} (exit status {result.rc}" + (f"; see {log.path})" if log else ")")
        raise HostInstallFailure(connection.host_id, Gate.REPORT.value, detail) from None
    if log is not None:
        log.result(result.rc, result.stdout, result.stderr, report)
    if lease is not None:
        lease.record(connection.host_id, report.lease, asked)
    if report.outcome == "failed":
        raise HostInstallFailure(connection.host_id, report.gate or Gate.REPORT.value, report.message or "(no message)")
    return report


def _read_pinned(host_id: str, run_dir: Path, prepared: PreparedFile) -> bytes:
    """The file's bytes, re-checked against the manifest: what is sent is exactly what was verified."""
    data = (run_dir / prepared.path).read_bytes()
    if hashlib.sha256(data).hexdigest() != prepared.sha256:
        raise HostInstallFailure(host_id, "prepared file", f"{run_dir / prepared.path}: changed after the manifest "
                                 "check; prepare a new run")  # fmt: skip
    return data

"""The operation's lease on every host it changes (`host/lease.py` on each host): one token, fenced, renewed.

A fleet operation (install, rollback, prune) takes a lease on each host it will change before it changes any
(`rollout` takes them with its first, read-only call to each host), renews them while it runs
(`Renewer`), and releases each when it is done with that host. Each host checks the token itself before
every change (fencing), so an operation paused past its lease (a laptop suspended, a VM frozen) whose hosts
were taken over changes nothing more when it resumes: it is told so per host. The lease lives on the hosts
themselves, not on a designated one, so the inventory's order decides nothing and a dead host blocks only
itself; two operations on overlapping host sets cannot both proceed, on disjoint sets they can.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from narwhal_assets.core.errors import LeaseError, LeaseReportError, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import REMOTE_BASE
from narwhal_assets.host import program_stream
from narwhal_assets.host.installer import boot_id, start_ticks
from narwhal_assets.protocols.lease import (
    LEASE_PROGRAM,
    LeaseHolder,
    LeaseReport,
    LeaseState,
    lease_script,
    parse_lease_report,
)
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.parallel import HOSTS_AT_ONCE, over_hosts
from narwhal_assets.ssh.transport import Connector, HostConnection
from narwhal_assets.workflows.pool import ConnectionPool

LEASE_ENV = "NARWHAL_LEASE_S"
# A host's lease lasts this long past its last renewal (host clock). Every held host is renewed once a third
# of it passed, over its own connection when a step is using it, else over a new one, so the length is a
# trade: an operator who vanished on another workstation blocks its hosts for at most this long (one killed
# on this workstation: not at all, `holder_gone`), and the renewals of idle hosts cost N / (length / 3)
# connections a second (1,000 hosts: 5 a second at 600 s).
DEFAULT_LEASE_S = 600.0
LEASE_BOUNDS = (2.0, 86400.0)
RENEW_FRACTION = 3  # each host's lease is renewed once a third of it has passed
MESSAGE_LIMIT = 512  # bytes of `--message`; one line (docs/install.md)
PARALLEL = HOSTS_AT_ONCE


def lease_seconds(settings: Settings) -> float:
    """`NARWHAL_LEASE_S` (seconds; default DEFAULT_LEASE_S), bounded."""
    text = settings.get(LEASE_ENV)
    low, high = LEASE_BOUNDS
    try:
        value = float(text) if text else DEFAULT_LEASE_S
    except ValueError:
        value = -1.0
    if not low <= value <= high:
        raise LeaseError(f"{LEASE_ENV}: must be a number of seconds from {low:.0f} to {high:.0f}")
    return value


def message_problems(message: str) -> list[str]:
    """`--message` is one printable line of at most MESSAGE_LIMIT bytes (UTF-8): every lock record stays
    readable by the code that wrote it."""
    problems = []
    if len(message.encode("utf-8", "surrogatepass")) > MESSAGE_LIMIT:
        problems.append(f"--message: at most {MESSAGE_LIMIT} bytes (UTF-8)")
    if any(not ch.isprintable() for ch in message):
        problems.append("--message: one line of printable text (no newline, tab or control character)")
    return problems


def this_process() -> dict[str, Any]:
    """Enough to tell, later and on this workstation only, whether this process still runs."""
    return {"workstation": socket.gethostname(), "boot": boot_id(), "pid": os.getpid(),
            "pid_start": start_ticks(os.getpid())}  # fmt: skip


# The operations this process runs now (their ids, not their tokens): a lease naming this process and an
# operation not among them was left by an operation that ended without releasing it (a host that was down
# then), and is taken over at once, as one of a process that is gone.
_LIVE: set[str] = set()
_LIVE_LOCK = threading.Lock()


def holder_gone(holder: LeaseHolder) -> dict[str, Any] | None:
    """The holder's identity when it is an operation of this workstation (same boot) that no longer runs: its
    process is gone, or it is this process and the operation ended."""
    if holder.workstation != socket.gethostname() or not holder.boot or holder.boot != boot_id() or not holder.pid:
        return None
    if start_ticks(holder.pid) == holder.pid_start:
        if holder.pid != os.getpid() or not holder.operation:
            return None  # another running process
        with _LIVE_LOCK:
            if holder.operation in _LIVE:
                return None  # an operation of this process, still running
    return {"workstation": holder.workstation, "boot": holder.boot, "pid": holder.pid, "pid_start": holder.pid_start,
            "operation": holder.operation}  # fmt: skip


@dataclass(frozen=True)
class LeaseRequest:
    """What the lease records say about the operation (never a destination or a password)."""

    command: str
    revision: str = ""
    deployment_id: str = ""
    message: str = ""

    def holder(self) -> dict[str, Any]:
        return {"user": getpass.getuser(), "command": self.command, "revision": self.revision,
                "deployment_id": self.deployment_id, "message": self.message,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **this_process()}  # fmt: skip


@dataclass
class OperationLease:
    """One operation's token and which hosts it holds; every host call reports its lease state here."""

    request: LeaseRequest
    lease_s: float = DEFAULT_LEASE_S
    token: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    held: dict[str, float] = field(default_factory=dict)  # host id -> monotonic time its lease was last confirmed
    lost: dict[str, str] = field(default_factory=dict)  # host id -> why it is not ours any more
    broken: dict[str, LeaseHolder] = field(default_factory=dict)  # host id -> the expired holder taken over
    conflicts: dict[str, LeaseState] = field(default_factory=dict)  # host id -> another's (or a stuck) lease
    _holder: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._holder = {**self.request.holder(), "operation": secrets.token_hex(8)}

    @contextmanager
    def active(self) -> Iterator[None]:
        """While this lasts the operation runs: its leases are never taken over as a gone holder's."""
        operation = self._holder["operation"]
        with _LIVE_LOCK:
            _LIVE.add(operation)
        try:
            yield
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(operation)

    def params(self, mode: str, release: str = "never", gone: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a host call carries: `mode` acquire or hold; `release` never, after or when_current; `gone`:
        the holder this workstation proved dead (its lease is taken over at once)."""
        return {"token": self.token, "mode": mode, "release": release, "holder": self._holder,
                "lease_s": self.lease_s, **({"holder_gone": gone} if gone else {})}  # fmt: skip

    def dead_holder(self, host_id: str) -> dict[str, Any] | None:
        """When the host refused because an operation of this workstation holds it whose process is gone (a
        killed command): that holder's identity, the conflict forgotten, so the caller takes it over."""
        with self._lock:
            state = self.conflicts.get(host_id)
            gone = holder_gone(state.holder) if state is not None and state.holder is not None else None
            if gone is not None:
                del self.conflicts[host_id]
            return gone

    def record(self, host_id: str, state: LeaseState | None, asked_at: float) -> None:
        """What a host said of the lease after a call sent at `asked_at` (monotonic)."""
        if state is None:
            return
        with self._lock:
            if state.broken is not None:
                self.broken[host_id] = state.broken
            if state.released or state.state == "absent":
                self.held.pop(host_id, None)
            elif state.state == "ours":
                self.held[host_id] = asked_at
            elif state.state == "lost":
                self.held.pop(host_id, None)
                self.lost[host_id] = state.holder.describe() if state.holder else "released or cleared"
            elif state.state in ("held", "broken"):
                self.conflicts[host_id] = state

    def due(self, now: float) -> list[str]:
        """Hosts whose lease should be renewed now (a third of it has passed since it was last confirmed)."""
        with self._lock:
            return sorted(h for h, at in self.held.items() if now - at > self.lease_s / RENEW_FRACTION)

    def lose(self, host_id: str, why: str) -> None:
        with self._lock:
            self.held.pop(host_id, None)
            self.lost[host_id] = why

    def stale(self, host_ids: Sequence[str], now: float) -> list[str]:
        """The hosts among `host_ids` whose lease was not confirmed recently enough to act on without renewing
        it first (more than half of it passed: a pause that long may have let another operation take it)."""
        with self._lock:
            return [h for h in host_ids if now - self.held.get(h, -1e18) > self.lease_s / 2]

    def held_hosts(self) -> list[str]:
        with self._lock:
            return sorted(self.held)


def call_lease(connection: HostConnection, action: str, lease: dict[str, Any]) -> LeaseReport:
    """One run of the lease program on the host."""
    script = lease_script({"remote_base": REMOTE_BASE, "action": action, "lease": lease})
    result = connection.run_program(LEASE_PROGRAM, program_stream(script))
    try:
        return parse_lease_report(result.stdout)
    except LeaseReportError as exc:
        raise LeaseError(f"host {connection.host_id}: lease: {exc} (exit status {result.rc})") from None


def lease_call(pool: ConnectionPool, lease: OperationLease, entry: HostEntry, action: str) -> LeaseReport | None:
    """`renew` or `release` of the operation's lease on one host over the pool; None when it could not be
    done (the host is unreachable: its lease runs out on its own)."""
    asked = time.monotonic()
    try:
        with pool.connection(entry) as connection:
            report = call_lease(connection, action, lease.params("hold"))
    except NarwhalError:
        return None
    lease.record(entry.id, report, asked)
    if report.outcome == "failed" and action == "renew":
        lease.lose(entry.id, report.message or "not this operation's any more")
    return report


def release_all(pool: ConnectionPool, lease: OperationLease, entries: dict[str, HostEntry], workers: int) -> None:
    """Release every lease the operation still holds (best effort: an unreachable host's runs out)."""
    held = [entries[h] for h in lease.held_hosts() if h in entries]
    over_hosts(held, lambda entry: lease_call(pool, lease, entry, "release"), workers)


class Renewer:
    """Renews each held host's lease once a third of it has passed, while the operation runs: over the
    connection a host's own step is using (a second channel alongside it), else over the pool (the host's
    kept connection when there is one)."""

    def __init__(self, pool: ConnectionPool, lease: OperationLease, entries: dict[str, HostEntry]) -> None:
        self.pool, self.lease, self.entries = pool, lease, entries
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="narwhal-lease-renewer", daemon=True)

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = max(0.2, self.lease.lease_s / (RENEW_FRACTION * 4))
        while not self._stop.wait(tick):
            for host_id in self.lease.due(time.monotonic()):
                if self._stop.is_set():
                    return
                busy = self.pool.in_use(host_id)
                if busy is not None:
                    renew_alongside(busy, self.lease)
                elif host_id in self.entries:
                    lease_call(self.pool, self.lease, self.entries[host_id], "renew")


def renew_alongside(connection: HostConnection, lease: OperationLease) -> None:
    """Renew over a connection a host's step is using (its own channel; a failure is that step's to find)."""
    asked = time.monotonic()
    try:
        report = call_lease(connection, "renew", lease.params("hold"))
    except NarwhalError:
        return
    lease.record(connection.host_id, report, asked)
    if report.outcome == "failed":
        lease.lose(connection.host_id, report.message or "not this operation's any more")


# ----------------------------------------------------------------------------- `deploy-hosts lease`


def read_leases(connector: Connector, settings: Settings, entries: Sequence[HostEntry]) -> list[LeaseReport | str]:
    """Each selected host's lease as it is (`show`), or why it could not be read; in the order given."""

    def one(entry: HostEntry) -> LeaseReport | str:
        try:
            with connector.connect(host_access(settings, entry)) as connection:
                return call_lease(connection, "show", {})
        except NarwhalError as exc:
            return str(exc)

    return over_hosts(entries, one, PARALLEL)


def release_leases(
    connector: Connector, settings: Settings, entries: Sequence[HostEntry], *, force: bool
) -> list[LeaseReport | str]:
    """Release each host's lease: with `force` whatever is there (`clear`, links never followed); without it
    only a holder proven gone (its process on this workstation ended) or whose lease expired."""

    def one(entry: HostEntry) -> LeaseReport | str:
        try:
            with connector.connect(host_access(settings, entry)) as connection:
                if force:
                    return call_lease(connection, "clear", {})
                shown = call_lease(connection, "show", {})
                gone = holder_gone(shown.holder) if shown.holder is not None else None
                return call_lease(connection, "release_dead", {"holder_gone": gone})
        except NarwhalError as exc:
            return str(exc)

    return over_hosts(entries, one, PARALLEL)

"""The fleet deploy lock: one `install`, `rollback` or `prune` at a time, from any workstation.

Kept on the fleet itself, like Kamal's lock on its primary host: `~/Narwhal-deploy/.fleet-lock/` on the
first inventory host (`host/fleet_lock.py` does every change there atomically). The holder refreshes its
lease every `REFRESH_S` over its own connection; a lease not refreshed for `LEASE_S` (host clock) may be
taken over by the next deploy, which says whose lock it broke. A deploy whose refresh failed stops before
it moves `current` anywhere (`FleetLock.check`). The lock has its own connection: it is taken before any
host is contacted (a canary goes first) and must outlast the rollout's per-group connections.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from narwhal_assets.core.deployment.manifest import REMOTE_BASE
from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.host.installer import boot_id, start_ticks
from narwhal_assets.protocols.fleet_lock import LockHolder, LockReport, LockReportError, lock_script, parse_lock_report
from narwhal_assets.protocols.install import BOOTSTRAP, install_stream
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.transport import Connector, HostConnection

LEASE_S = 60.0
REFRESH_S = 10.0


class FleetLockError(NarwhalError):
    """The fleet lock is held by another deploy, or its host could not be reached or answered badly."""


@dataclass(frozen=True)
class LockRequest:
    """What the holder's record says about the deploy (never a destination or a password)."""

    command: str
    revision: str = ""
    deployment_id: str = ""
    message: str = ""

    def owner(self) -> dict[str, Any]:
        return {
            "user": getpass.getuser(), "workstation": socket.gethostname(), "command": self.command,
            "revision": self.revision, "deployment_id": self.deployment_id, "message": self.message,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **_this_process(),
        }  # fmt: skip


def _this_process() -> dict[str, Any]:
    """Enough to tell, later and on this workstation only, whether this process still runs."""
    return {"boot": boot_id(), "pid": os.getpid(), "pid_start": start_ticks(os.getpid())}


def holder_gone(holder: LockHolder) -> dict[str, Any] | None:
    """The holder's identity when it is a deploy of this workstation (same boot) whose process is gone."""
    if holder.workstation != socket.gethostname() or not holder.boot or holder.boot != boot_id() or not holder.pid:
        return None
    if start_ticks(holder.pid) == holder.pid_start:
        return None  # still running
    return {"workstation": holder.workstation, "boot": holder.boot, "pid": holder.pid, "pid_start": holder.pid_start}


def lock_host(inventory: Inventory) -> HostEntry:
    """Where the lock lives: the first host of the inventory, whatever a command selects."""
    return inventory.hosts[0]


def call_lock(connection: HostConnection, params: dict[str, Any]) -> LockReport:
    script = lock_script({"remote_base": REMOTE_BASE, "lease_s": LEASE_S, **params})
    result = connection.run(BOOTSTRAP, stdin=install_stream(script))
    try:
        return parse_lock_report(result.stdout)
    except LockReportError as exc:
        raise FleetLockError(f"host {connection.host_id}: fleet lock: {exc} (exit status {result.rc})") from None


def show_lock(connector: Connector, settings: Settings, inventory: Inventory) -> LockReport:
    entry = lock_host(inventory)
    with connector.connect(host_access(settings, entry)) as connection:
        return call_lock(connection, {"action": "show", "token": ""})


def release_lock(connector: Connector, settings: Settings, inventory: Inventory, *, force: bool) -> LockReport:
    """Release without the token: only `force` does (`deploy-hosts lock --release --force`)."""
    entry = lock_host(inventory)
    with connector.connect(host_access(settings, entry)) as connection:
        return call_lock(connection, {"action": "release", "token": "", "force": force})


def holder_is_me(holder: LockHolder) -> bool:
    return holder.user == getpass.getuser() and holder.workstation == socket.gethostname()


class FleetLock:
    """Held for the life of a `with` block; `broken` is the stale holder it took over from, if any."""

    def __init__(self, connector: Connector, settings: Settings, inventory: Inventory, request: LockRequest):
        self.connector, self.settings, self.request = connector, settings, request
        self.entry = lock_host(inventory)
        self.token = secrets.token_hex(16)
        self.broken: LockHolder | None = None
        self.lost: str | None = None
        self.connection: HostConnection | None = None
        self._stop = threading.Event()
        self._refresher = threading.Thread(target=self._refresh, name="narwhal-fleet-lock", daemon=True)
        self._calls = threading.Lock()

    def __enter__(self) -> FleetLock:
        try:
            self.connection = self.connector.connect(host_access(self.settings, self.entry))
        except NarwhalError as exc:
            raise FleetLockError(f"the fleet lock on host {self.entry.id} cannot be taken: {exc}") from None
        try:
            report = self._call({"action": "acquire", "owner": self.request.owner()})
            gone = holder_gone(report.holder) if report.outcome != "acquired" and report.holder else None
            if gone is not None:  # a killed deploy of this workstation: its lock is taken over at once
                report = self._call({"action": "acquire", "owner": self.request.owner(), "holder_gone": gone})
        except BaseException:
            self.connection.close()
            raise
        if report.outcome != "acquired":
            self.connection.close()
            if report.holder is not None:
                raise FleetLockError(f"another deploy holds the fleet lock (on host {self.entry.id}): "
                                     f"{report.holder.describe(report.now)}; see deploy-hosts lock")  # fmt: skip
            raise FleetLockError(f"the fleet lock on host {self.entry.id} cannot be taken: {report.message}")
        self.broken = report.broken
        self._refresher.start()
        return self

    def check(self) -> None:
        """Raise if the lease could not be refreshed: another deploy may hold the fleet by now."""
        if self.lost is not None:
            raise FleetLockError(f"the fleet lock on host {self.entry.id} was lost ({self.lost}); nothing more "
                                 "is changed")  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._refresher.is_alive():
            self._refresher.join()
        try:
            if self.lost is None:
                self._call({"action": "release"})
        except NarwhalError:
            pass  # the lease runs out on its own; the next deploy takes it over and says so
        finally:
            if self.connection is not None:
                self.connection.close()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                report = self._call({"action": "refresh"})
            except NarwhalError as exc:
                self.lost = str(exc)
                return
            if report.outcome != "refreshed":
                self.lost = report.message or "the lock was taken over"
                return

    def _call(self, params: dict[str, Any]) -> LockReport:
        assert self.connection is not None
        with self._calls:
            return call_lock(self.connection, {"token": self.token, **params})

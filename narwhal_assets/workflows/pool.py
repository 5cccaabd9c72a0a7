"""SSH connections for a fleet operation: at most `capacity` open at once, kept per host while room allows.

A fleet operation contacts each host in several steps (take the lease and inspect, stage, activate and
release), with the whole fleet staged before any host moves. Keeping every host's connection open from the
first step to the last made sockets, paramiko threads and file descriptors grow with the fleet (about 1,000
sessions and 3,000 threads at 1,000 hosts). Here a connection goes back to the pool after each step and is
reused by the host's next step when it is still open; when `capacity` connections are open, the least
recently used idle one (another host's) is closed to make room, and a caller waits only while every open
connection is busy. On a fleet no larger than `capacity` nothing is ever reconnected.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.transport import Connector, HostConnection


class ConnectionPool:
    def __init__(self, connector: Connector, settings: Settings, capacity: int) -> None:
        self.connector, self.settings, self.capacity = connector, settings, max(1, capacity)
        self._idle: OrderedDict[str, HostConnection] = OrderedDict()  # least recently used first
        self._in_use: dict[str, HostConnection] = {}
        self._busy = 0
        self._changed = threading.Condition()
        self._closed = False  # after `close`, a connection given back is closed, never kept
        self.opened = 0  # connections made (for the log line and the benchmarks)
        self.peak = 0  # the most open at once

    @contextmanager
    def connection(self, entry: HostEntry) -> Iterator[HostConnection]:
        """The host's open connection, or a new one; returned to the pool when the block ends normally, closed
        when it raised (a connection that failed mid-command is not trusted again)."""
        connection = self._take(entry)
        with self._changed:
            self._in_use[entry.id] = connection
        ok = False
        try:
            yield connection
            ok = True
        finally:
            with self._changed:
                self._in_use.pop(entry.id, None)
            self._give_back(entry.id, connection, keep=ok)

    def in_use(self, host_id: str) -> HostConnection | None:
        """The host's connection while a step of its own uses it (another channel on it can run alongside)."""
        with self._changed:
            return self._in_use.get(host_id)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            idle, self._idle = list(self._idle.values()), OrderedDict()
            self._changed.notify_all()
        for connection in idle:
            connection.close()

    def _take(self, entry: HostEntry) -> HostConnection:
        closing: list[HostConnection] = []  # closed outside the lock (a close may wait on the network)
        with self._changed:
            while True:
                kept = self._idle.pop(entry.id, None)
                if kept is not None and kept.transport.is_active():
                    self._busy += 1
                    return kept
                if kept is not None:
                    closing.append(kept)  # the host or the watchdog ended it meanwhile
                if self._busy + len(self._idle) < self.capacity:
                    break
                if self._idle:
                    closing.append(self._idle.popitem(last=False)[1])
                    break
                self._changed.wait()
            self._busy += 1
            self.peak = max(self.peak, self._busy + len(self._idle))
        for connection in closing:
            connection.close()
        try:
            connection = self.connector.connect(host_access(self.settings, entry))
        except BaseException:
            with self._changed:
                self._busy -= 1
                self._changed.notify()
            raise
        self.opened += 1
        return connection

    def _give_back(self, host_id: str, connection: HostConnection, *, keep: bool) -> None:
        with self._changed:
            self._busy -= 1
            if keep and not self._closed and connection.transport.is_active():
                self._idle[host_id] = connection
                connection = None  # type: ignore[assignment]
            self._changed.notify()
        if connection is not None:
            connection.close()

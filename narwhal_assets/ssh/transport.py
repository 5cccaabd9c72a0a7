"""Non-interactive SSH with paramiko: one verified connection per physical host, reused for every command.

The host key is checked against the checkout-local store right after key exchange and before any
credential is sent. There is no missing-host-key policy: paramiko's `SSHClient` is not used at all.

Every step is bounded and every failure says which bound was hit: TCP connect, SSH banner and key
exchange, and authentication each by `connect_timeout`; each command by its timeout and an output cap;
the whole host (connect plus all its work in `map_hosts`) by `host_timeout`; and a peer that goes silent
(cut link, frozen host) by keep-alives while a command or upload runs: a request every `alive_interval`
seconds that must be answered within `alive_interval * alive_count` seconds. Remote commands run under
`narwhal_assets.host.guard`, so a command we stop (timeout, output cap, lost connection) or that exits
leaves no process on the host.

Where and how each connection goes is OpenSSH's answer for the destination (destination.py): the route
(ProxyJump hops, each verified against the store and authenticated as its own config says; a ProxyCommand,
run as OpenSSH runs it and killed with the connection; or TCP with AddressFamily and BindAddress), the
identities in OpenSSH's order (identities.py), the agent IdentityAgent names, the algorithm lists,
ConnectTimeout (never longer than our own connect timeout) and the name the host key is checked under
(HostKeyAlias). A host whose config asks for what this transport cannot do is refused before any connection.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import select
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import paramiko

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError, NarwhalError, SshFailure
from narwhal_assets.host import program_source
from narwhal_assets.host.guard import PROGRAM
from narwhal_assets.ssh import identities
from narwhal_assets.ssh.destination import Endpoint, resolve_endpoint
from narwhal_assets.ssh.parallel import over_hosts
from narwhal_assets.ssh.pipelined import exec_without_waiting
from narwhal_assets.ssh.proxy import ProxyCommand
from narwhal_assets.ssh.resolver import config_label
from narwhal_assets.ssh.trust import HostKey, KnownHostsStore, TrustMode, Verdict

T = TypeVar("T")
# paramiko's transport thread logs a connection's failure that this module raises itself (and reports once);
# with no handler of its own Python's last-resort handler would print it, traceback included, on stderr.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 600.0  # one command (an install's installer run is the longest); every caller's default
DEFAULT_HOST_TIMEOUT = 3600.0
DEFAULT_ALIVE_INTERVAL = 5.0
DEFAULT_ALIVE_COUNT = 3
DEFAULT_OUTPUT_LIMIT = 8 << 20
GUARD_GRACE_S = 5.0  # the guard's own deadline trails ours: it only matters when our close cannot arrive
KEEPALIVE_REQUEST = "keepalive@openssh.com"
READ_CHUNK = 65536
SEND_CHUNK = 32768
# How often an idle connection's paramiko thread wakes once authenticated (paramiko's own is 0.1 s, which
# cost 0.7 ms of workstation CPU per host per second: 42 ms per host over a one-minute install). Closing
# does not wait for it: `_PromptSocket.close` shuts the socket down, which ends a blocked read at once.
IDLE_WAKE_S = 2.0
ADDRESS_FAMILIES = {"inet": socket.AF_INET, "inet6": socket.AF_INET6}
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
PROXY_EXIT_WAIT_S = 0.5  # how long a failed handshake waits for its ProxyCommand's exit status, for the message
# ssh -G option -> paramiko's SecurityOptions attribute
SECURITY_OPTIONS = {"ciphers": "ciphers", "kexalgorithms": "kex", "macs": "digests", "hostkeyalgorithms": "key_types"}


@dataclass(frozen=True)
class HostAccess:
    """How to reach one physical host. The password never appears in repr, logs or errors."""

    host_id: str
    destination_env: str
    destination: str = field(repr=False)
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: bytes
    stderr: bytes
    seconds: float

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


def guard_source() -> str:
    """The guard program's source, exactly as shipped in the package."""
    return program_source("guard.py")


def guard_argv(limit: float, command: str | None) -> list[str]:
    """The guard's command line with a `limit`-second backstop: for shell `command`, or (None) for the host
    program framed on its stdin (`narwhal_assets.host.program_stream`), run in the guard's own interpreter."""
    # -I -S: nothing of the account's Python environment, and no `site` import (half the guard's start-up)
    head = ["python3", "-I", "-S", "-c", guard_source(), f"{limit:.0f}"]
    return [*head, "/bin/sh", "-c", command] if command is not None else [*head, PROGRAM]


def guarded(command: str | None, limit: float) -> str:
    """The remote command line that runs `command` (None: the framed host program) under the guard."""
    return "exec " + shlex.join(guard_argv(limit, command))


class Watchdog:
    """Closes a transport when its peer stops answering keep-alives or the host's deadline passes.

    paramiko's own keep-alive only sends; it never notices silence, so a cut link used to surface only
    when TCP gave up (~16 minutes). Here, while a command or an upload is under way on the connection
    (`watching`), one thread sends a keep-alive every `interval` and waits for its answer; another closes
    the transport once no answer came for the window (`interval` x `count`) or the deadline passed; `reason`
    then says which bound ended the connection. Between commands nothing is sent: a fleet install keeps each
    staged host's connection open until every host staged, and keep-alives on those idle connections made
    the workstation's CPU per host grow with the fleet (0.18 ms a second per connection with them, 0.07
    without). A link cut while idle is found by the next command's keep-alives, within the same window.
    """

    def __init__(self, transport: paramiko.Transport, interval: float, count: int, deadline: float, host: float):
        self.transport = transport
        self.interval, self.count, self.window = interval, count, interval * count
        self.deadline, self.host_timeout = deadline, host
        self.reason: str | None = None
        self._answered = time.monotonic()
        self._working = 0  # commands and uploads under way (guarded by _lock)
        self._lock = threading.Lock()
        self._busy = threading.Event()  # set while _working > 0 (what the threads wait on), and on stop
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._ping, name="ssh-keepalive", daemon=True),
                         threading.Thread(target=self._guard, name="ssh-watchdog", daemon=True)]  # fmt: skip

    def start(self) -> Watchdog:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._busy.set()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep-alives run while the body runs; the silence window starts when the first of them begins."""
        with self._lock:
            if self._working == 0:
                self._answered = time.monotonic()
                self._busy.set()
            self._working += 1
        try:
            yield
        finally:
            with self._lock:
                self._working -= 1
                if self._working == 0 and not self._stopped.is_set():
                    self._busy.clear()

    def _ping(self) -> None:
        while self._busy.wait() and not self._stopped.wait(self.interval) and self.transport.is_active():
            if not self._busy.is_set():
                continue  # the work ended during the interval: nothing to watch
            try:
                self.transport.global_request(KEEPALIVE_REQUEST, wait=True)  # returns when answered or closed
            except (paramiko.SSHException, OSError, EOFError):
                return
            self._answered = time.monotonic()

    def _guard(self) -> None:
        while not self._stopped.is_set():
            if not self.transport.is_active():
                return
            now = time.monotonic()
            if now >= self.deadline:
                return self._expire(self._host_expired())
            if not self._busy.is_set():
                self._busy.wait(self.deadline - now)  # idle: only the deadline, or work starting, wakes it
            elif now - self._answered > self.window:
                return self._expire(self._silent())
            else:
                self._stopped.wait(min(self.interval, self.deadline - now))

    def _silent(self) -> str:
        return f"connection lost: no reply to keep-alive within {self.window:g} s ({self.interval:g} s x {self.count})"

    def _host_expired(self) -> str:
        return f"the host did not finish within {self.host_timeout:.0f} s (host timeout)"

    def _expire(self, reason: str) -> None:
        if not self._stopped.is_set() and self.reason is None:
            self.reason = reason
        self.transport.close()


class Route(list[paramiko.Transport | ProxyCommand]):
    """What carries a connection to its host: ProxyJump transports and ProxyCommands, outermost first;
    closed innermost first, with the connection."""

    def close(self) -> None:
        for part in reversed(self):
            part.close()
        self.clear()

    def proxy_stderr(self) -> list[str]:
        """What each ProxyCommand on the route printed on standard error (for the host's log)."""
        return [part.stderr() for part in self if isinstance(part, ProxyCommand) and part.stderr()]


@dataclass
class HostConnection:
    """An authenticated transport to one host (plus the ProxyJump transports and ProxyCommands under it)."""

    access: HostAccess
    endpoint: Endpoint
    verdict: Verdict
    transport: paramiko.Transport
    route: Route
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    watchdog: Watchdog | None = None

    @property
    def host_id(self) -> str:
        return self.access.host_id

    @property
    def fingerprint(self) -> str:
        return self.verdict.fingerprint

    def run(self, command: str, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run `command` on the host under the guard, feeding `stdin`; bounded by `timeout` seconds and the
        output limit (stdout plus stderr). Stopping it for any reason stops its processes on the host."""
        with self._watched():
            return self._run(command, f"command `{printable(command, 60)}`", stdin, timeout)

    def run_program(self, name: str, stream: bytes, timeout: float | None = None) -> CommandResult:
        """Run host program `name` (`probe.py`, `installer.py`, ...), framed in `stream` with its input
        (`narwhal_assets.host.program_stream`), in the guard's interpreter; bounded as `run` is."""
        with self._watched():
            return self._run(None, f"host program `{name}`", stream, timeout)

    def _run(self, command: str | None, label: str, stdin: bytes | None, timeout: float | None) -> CommandResult:
        started = time.monotonic()
        limit = self.command_timeout if timeout is None else timeout
        try:
            channel = self.transport.open_session(timeout=limit)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failure(self._lost() or f"{label}: cannot open a session: {_describe(exc)}") from None
        try:
            exec_without_waiting(channel, guarded(command, limit + GUARD_GRACE_S))  # its input follows at once
            outcome = _exchange(channel, stdin or b"", started + limit, self.output_limit)
            rc = channel.recv_exit_status() if outcome.ended == "exited" else -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failure(self._lost() or f"{label} failed: {_describe(exc)}") from None
        finally:  # closing on a transport already gone raises; what ended the command is said below
            with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
                channel.close()
        if outcome.ended == "timeout":
            raise self._failure(f"{label} did not finish within {limit:.0f} s (command timeout); stopped it")
        if outcome.ended == "output":
            raise self._failure(
                f"{label} printed more than {self.output_limit} bytes (output limit); stopped reading and stopped it"
            )
        if outcome.ended == "closed":
            raise self._failure(self._lost() or f"connection closed by the host before {label} finished")
        return CommandResult(rc, outcome.stdout, outcome.stderr, time.monotonic() - started)

    def put(self, data: bytes, remote_path: str, mode: int = 0o600) -> None:
        """Write `data` to `remote_path` (created with `mode` before any byte is written)."""
        with self._watched():
            try:
                sftp = paramiko.SFTPClient.from_transport(self.transport)
                if sftp is None:
                    raise paramiko.SSHException("the server refused the SFTP subsystem")
                sftp.get_channel().settimeout(self.command_timeout)  # type: ignore[union-attr]  # a client made from a transport has one
                with sftp, sftp.open(remote_path, "wb") as handle:
                    handle.chmod(mode)
                    handle.write(data)
            except (paramiko.SSHException, OSError) as exc:
                raise self._failure(self._lost() or f"upload to {remote_path} failed: {_describe(exc)}") from None

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.transport.close()
        self.route.close()

    def _watched(self) -> contextlib.AbstractContextManager[None]:
        return self.watchdog.watching() if self.watchdog is not None else contextlib.nullcontext()

    def _lost(self) -> str | None:
        """Why the watchdog ended the connection, if it did."""
        return self.watchdog.reason if self.watchdog is not None else None

    def _failure(self, cause: str) -> SshFailure:
        return SshFailure(f"host {self.host_id} ({self.endpoint.address}): {cause}")

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Exchange:
    stdout: bytes
    stderr: bytes
    ended: str  # exited | timeout | output | closed


def _exchange(channel: paramiko.Channel, stdin: bytes, deadline: float, output_limit: int) -> _Exchange:
    """Feed stdin while reading stdout and stderr (neither side can block the other) until the command
    exits and both streams end, the deadline passes, the output limit is exceeded, or the channel closes."""
    out, err = bytearray(), bytearray()
    pending = memoryview(stdin)
    if not pending:
        channel.shutdown_write()
    while True:
        # Both read before draining: data arrives before EOF, exit status and close, so none is lost.
        closed = channel.closed or not channel.get_transport().is_active()
        finished = channel.exit_status_ready() and (channel.eof_received or closed)
        while channel.recv_ready() and len(out) + len(err) <= output_limit:
            out += channel.recv(READ_CHUNK)
        while channel.recv_stderr_ready() and len(out) + len(err) <= output_limit:
            err += channel.recv_stderr(READ_CHUNK)
        if len(out) + len(err) > output_limit:
            return _Exchange(bytes(out), bytes(err), "output")
        if finished:  # paramiko reports a close without any exit status as status -1
            return _Exchange(bytes(out), bytes(err), "exited" if channel.recv_exit_status() != -1 else "closed")
        if closed:
            return _Exchange(bytes(out), bytes(err), "closed")
        left = deadline - time.monotonic()
        if left <= 0:
            return _Exchange(bytes(out), bytes(err), "timeout")
        if pending and channel.send_ready():
            sent = channel.send(pending[:SEND_CHUNK])  # type: ignore[arg-type]  # paramiko sends any buffer
            pending = pending[sent:]
            if not pending:
                channel.shutdown_write()
            continue
        if channel.eof_received:  # no more data (EOF covers stderr too): wait for the exit status or close
            channel.status_event.wait(left)
            continue
        # The channel's pipe wakes us for data, EOF and close (a dying transport closes its channels): no
        # polling while a long command runs, only the deadline.
        select.select([channel], [], [], min(0.05, left) if pending else left)


class _PromptSocket(socket.socket):
    """A TCP socket for SSH's small request/answer messages: no 40 ms delayed-ACK stalls either way.

    TCP_NODELAY sends each of our messages at once instead of holding it until the host acknowledged the
    previous one. The host's sshd keeps Nagle on for non-interactive sessions, so it holds its reply the same
    way until we acknowledge; TCP_QUICKACK (which the kernel may drop after any read, hence re-armed after
    each) makes us acknowledge at once. Measured against a simulated host: connect 82 -> 38 ms, the first
    command on a connection 86 -> 43 ms.
    """

    @classmethod
    def open(cls, endpoint: Endpoint, timeout: float) -> socket.socket:
        """Connect as OpenSSH does: each address of the host name in turn (only IPv4 or IPv6 ones with
        AddressFamily), from BindAddress if set, with TCPKeepAlive."""
        family = ADDRESS_FAMILIES.get(endpoint.address_family, socket.AF_UNSPEC)
        failure: OSError = OSError("no address")
        for fam, kind, proto, _, address in socket.getaddrinfo(endpoint.host, endpoint.port, family,
                                                                socket.SOCK_STREAM):  # fmt: skip
            sock = cls(fam, kind, proto)
            try:
                sock.settimeout(timeout)
                if endpoint.bind_address:
                    sock.bind((endpoint.bind_address, 0))
                sock.connect(address)
            except OSError as exc:
                sock.close()
                failure = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(endpoint.tcp_keepalive))
            return sock
        raise failure

    def recv(self, size: int, flags: int = 0) -> bytes:
        data = super().recv(size, flags)
        if hasattr(socket, "TCP_QUICKACK"):  # Linux only
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data

    def close(self) -> None:
        """Shut down first: a read blocked in the transport's thread returns at once, not at its timeout."""
        with contextlib.suppress(OSError):
            self.shutdown(socket.SHUT_RDWR)
        super().close()


@dataclass
class Connector:
    """Opens verified connections with one trust store and mode, within the bounds described above."""

    store: KnownHostsStore
    mode: TrustMode
    ssh_config: Path | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    alive_interval: float = DEFAULT_ALIVE_INTERVAL
    alive_count: int = DEFAULT_ALIVE_COUNT
    output_limit: int = DEFAULT_OUTPUT_LIMIT

    def connect(self, access: HostAccess, deadline: float | None = None) -> HostConnection:
        """Verify the host key (and every ProxyJump hop's) against the store, then authenticate.

        The connection is watched until closed: keep-alives, and `deadline` (monotonic; default: now plus
        `host_timeout`) for everything done on it.
        """
        deadline = time.monotonic() + self.host_timeout if deadline is None else deadline
        endpoint = self._endpoint(access)
        route = Route()
        try:
            sock = self._reach(access, endpoint, route)
            transport, verdict = self._open(access, endpoint, sock, route, password=access.password)
        except BaseException:
            route.close()
            raise
        watchdog = Watchdog(transport, self.alive_interval, self.alive_count, deadline, self.host_timeout).start()
        return HostConnection(
            access, endpoint, verdict, transport, route, self.command_timeout, self.output_limit, watchdog
        )

    def map_hosts(
        self, accesses: list[HostAccess], work: Callable[[HostConnection], T], workers: int = 64
    ) -> dict[str, T | NarwhalError]:
        """Connect to every host in parallel and run `work` on each; failures are collected, not raised.

        Each host has `host_timeout` seconds from its start for connecting and all of `work`.
        """

        def one(access: HostAccess) -> T | NarwhalError:
            try:
                with self.connect(access, time.monotonic() + self.host_timeout) as connection:
                    return work(connection)
            except NarwhalError as exc:
                return exc

        results = over_hosts(accesses, one, workers)
        return {access.host_id: result for access, result in zip(accesses, results, strict=True)}

    def presented_key(self, access: HostAccess) -> tuple[Endpoint, HostKey]:
        """The key the target presents, read after key exchange; no credential is sent to the target."""
        endpoint = self._endpoint(access)
        route = Route()
        try:
            transport, presented = self._handshake(access, endpoint, self._reach(access, endpoint, route), route)
            transport.close()
            return endpoint, presented
        finally:
            route.close()

    def _endpoint(self, access: HostAccess) -> Endpoint:
        """OpenSSH's answer for the host's destination; refused when it asks for what this transport cannot do."""
        who = f"host {access.host_id} ({access.destination_env})"
        try:
            endpoint = resolve_endpoint(access.destination, self.ssh_config)
        except InputError as exc:
            raise InputError([f"{who}: {p}" for p in exc.problems]) from None
        endpoint.refuse(who)
        for hop in endpoint.hops():
            _check_method(hop, "publickey", f"{who} (ProxyJump hop {hop.destination})")
        _check_method(endpoint, "password" if access.password is not None else "publickey", who)
        return endpoint

    def _reach(self, access: HostAccess, endpoint: Endpoint, route: Route) -> socket.socket | paramiko.Channel:
        """A stream to `endpoint`, as OpenSSH makes it: through its ProxyJump hop (itself reached the same way,
        its key verified and its user authenticated here), through its ProxyCommand, or over TCP."""
        where = f"host {access.host_id} ({endpoint.address})"
        if endpoint.via is not None:
            hop_sock = self._reach(access, endpoint.via, route)
            hop, _ = self._open(access, endpoint.via, hop_sock, route, password=None, hop=True)
            route.append(hop)
            return self._tunnel(access, hop, endpoint.via, endpoint)
        if endpoint.proxy_command is not None:
            try:
                proxy = ProxyCommand(endpoint.proxy_command)
            except OSError as exc:
                raise SshFailure(f"{where}: {exc.strerror} ({config_label(endpoint.config)})") from None
            route.append(proxy)
            return proxy.sock
        timeout = self._connect_timeout(endpoint)
        try:
            return _PromptSocket.open(endpoint, timeout)
        except OSError as exc:
            raise SshFailure(f"{where}: cannot connect: {_describe(exc, timeout)}") from None

    def _connect_timeout(self, endpoint: Endpoint) -> float:
        """ConnectTimeout from the config, never longer than ours."""
        if endpoint.connect_timeout:
            return min(float(endpoint.connect_timeout), self.connect_timeout)
        return self.connect_timeout

    def _handshake(
        self, access: HostAccess, endpoint: Endpoint, sock: socket.socket | paramiko.Channel, route: Route
    ) -> tuple[paramiko.Transport, HostKey]:
        where = f"host {access.host_id} ({endpoint.address})"
        timeout = self._connect_timeout(endpoint)
        accepted = endpoint.algorithms.names("pubkeyacceptedalgorithms")
        rejected = identities.rejected_signatures(accepted) if accepted is not None else []
        transport = paramiko.Transport(sock, disabled_algorithms={"pubkeys": rejected})
        began = time.monotonic()
        try:
            transport.banner_timeout = timeout
            transport.handshake_timeout = timeout
            transport.auth_timeout = timeout
            _apply_algorithms(transport, endpoint, self.store)
            transport.use_compression(endpoint.compression)
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            transport.close()
            # paramiko reports the banner or key exchange timing out in several ways ("Error reading SSH
            # protocol banner", "No existing session"): the clock says which bound it was
            late = time.monotonic() - began >= timeout
            cause = f"did not finish within {timeout:.0f} s (connect timeout)" if late else f"failed: {_describe(exc)}"
            raise SshFailure(f"{where}: SSH handshake {cause}{_proxy_said(sock, route, access)}") from None
        return transport, _presented(key)

    def _open(
        self,
        access: HostAccess,
        endpoint: Endpoint,
        sock: socket.socket | paramiko.Channel,
        route: Route,
        password: str | None,
        *,
        hop: bool = False,
    ) -> tuple[paramiko.Transport, Verdict]:
        transport, presented = self._handshake(access, endpoint, sock, route)
        who, hop_of = (endpoint.alias, access.host_id) if hop else (access.host_id, None)
        try:
            verdict = self.store.verify(who, *endpoint.known_host, presented, self.mode, hop_of=hop_of)
            _authenticate(transport, endpoint, password, f"host {access.host_id} ({endpoint.address})")
            transport.sock.settimeout(IDLE_WAKE_S)  # handshake and authentication are bounded; now just idle
        except BaseException:
            transport.close()
            raise
        return transport, verdict

    def _tunnel(
        self, access: HostAccess, hop: paramiko.Transport, jump: Endpoint, target: Endpoint
    ) -> paramiko.Channel:
        """`ssh -W '[%h]:%p' hop`: a direct-tcpip channel from the hop to the next host's name and port."""
        timeout = self._connect_timeout(jump)
        try:
            return hop.open_channel("direct-tcpip", (target.host, target.port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError) as exc:
            raise SshFailure(
                f"host {access.host_id} ({target.address}): ProxyJump through {jump.address} failed: "
                f"{_describe(exc, timeout)}"
            ) from None


def _proxy_said(sock: socket.socket | paramiko.Channel, route: Route, access: HostAccess) -> str:
    """When the stream was a ProxyCommand's: its exit status and last line on standard error, with the
    destination's value (which a ProxyCommand may print, as `%n`) replaced: messages never carry one."""
    proxy = next((part for part in route if isinstance(part, ProxyCommand) and part.sock is sock), None)
    if proxy is None:
        return ""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proxy.process.wait(PROXY_EXIT_WAIT_S)
    host = access.destination.rpartition("@")[2]
    values = "|".join(re.escape(v) for v in sorted({access.destination, host} - {""}, key=len, reverse=True))
    return "; " + re.sub(rf"(?<![\w.-])(?:{values})(?![\w.-])", f"<{access.destination_env}>", proxy.describe())


def _apply_algorithms(transport: paramiko.Transport, endpoint: Endpoint, store: KnownHostsStore) -> None:
    """Offer exactly OpenSSH's algorithm lists (those paramiko implements). Where the config set a list its
    order is kept; otherwise AES-GCM comes first among the ciphers, and the host key algorithms are OpenSSH's
    default (host certificates first) in the order OpenSSH gives them for this host: the key types the store
    holds for it first, certificate algorithms first where an @cert-authority line covers it (so a host
    certificate is presented, checked against its CA, and an @revoked CA is seen)."""
    options = transport.get_security_options()
    for option, attribute in SECURITY_OPTIONS.items():
        names = endpoint.algorithms.names(option)
        configured = option in endpoint.algorithms.configured
        if names is None:
            names = tuple(getattr(options, attribute))
        if option == "hostkeyalgorithms" and not configured:
            names = tuple(store.host_key_algorithms(*endpoint.known_host, list(names)))
        if option == "ciphers" and not configured:
            first = [name for name in AEAD_CIPHERS if name in names]
            names = (*first, *(name for name in names if name not in first))
        setattr(options, attribute, names)


def _presented(key: paramiko.PKey) -> HostKey:
    """The host key the server presented, or its certificate (which the store checks against a CA line)."""
    blob = key.public_blob
    if blob is not None:
        return HostKey(blob.key_type, base64.b64encode(blob.key_blob).decode())
    return HostKey(key.get_name(), key.get_base64())


def _authenticate(transport: paramiko.Transport, endpoint: Endpoint, password: str | None, where: str) -> None:
    method = "password" if password is not None else "publickey"
    shown = "password" if password is not None else "key/agent"
    try:
        if password is not None:
            transport.auth_password(endpoint.user, password)
        else:
            _auth_keys(transport, endpoint)
    except paramiko.BadAuthenticationType as exc:
        allowed = ",".join(exc.allowed_types) or "none"
        raise SshFailure(f"{where}: the host does not accept {method} authentication for user {endpoint.user} "
                         f"(it accepts: {printable(allowed, 80)}; keyboard-interactive, GSSAPI and host-based "
                         "authentication are not supported here)") from None  # fmt: skip
    except paramiko.AuthenticationException as exc:
        if "timeout" in str(exc).lower():  # paramiko's "Authentication timeout." after auth_timeout seconds
            raise SshFailure(
                f"{where}: authentication ({shown}) did not finish within {transport.auth_timeout:.0f} s "
                "(connect timeout)"
            ) from None
        raise SshFailure(f"{where}: authentication failed for user {endpoint.user} ({shown}){_missing(endpoint)}") \
            from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SshFailure(f"{where}: connection lost during authentication ({shown}): {_describe(exc)}") from None
    if not transport.is_authenticated():
        raise SshFailure(f"{where}: authentication failed for user {endpoint.user}")


def _check_method(endpoint: Endpoint, method: str, where: str) -> None:
    """Refuse a host whose config turns off the one method it is reached by (key, or its password)."""
    if method in endpoint.auth_methods:
        return
    option, value = endpoint.auth_off.get(method, ("PreferredAuthentications", ""))
    raise InputError([f"{where}: {option} {printable(value, 120)} ({config_label(endpoint.config)}): turns off "
                      f"{method} authentication, the only method these connections can use for this host"])  # fmt: skip


def _missing(endpoint: Endpoint) -> str:
    """Which configured identity or certificate files do not exist (OpenSSH skips them silently)."""
    missing = [f"CertificateFile {path}" for path in endpoint.certificate_files if not os.path.exists(path)]
    if not any(os.path.exists(path) for path in endpoint.identity_files):
        missing.append("every IdentityFile")
    return f"; not found: {printable(', '.join(missing), 200)}" if missing else ""


def _auth_keys(transport: paramiko.Transport, endpoint: Endpoint) -> None:
    """Offer each identity in OpenSSH's order until one is accepted (see identities.py)."""
    accepted = endpoint.algorithms.names("pubkeyacceptedalgorithms")
    agent_keys, agent = identities.agent_keys(endpoint.identity_agent, transport.auth_timeout or 10.0)
    try:
        offers = identities.offers(endpoint.identity_files, endpoint.certificate_files, agent_keys,
                                   endpoint.identities_only, accepted)  # fmt: skip
        for offer in offers:
            key = offer.key(offers)
            if key is None:
                continue
            try:
                transport.auth_publickey(endpoint.user, key)
            except paramiko.BadAuthenticationType:
                raise
            except paramiko.AuthenticationException:
                continue
            if transport.is_authenticated():
                return
    finally:
        if agent is not None:
            agent.close()
    raise paramiko.AuthenticationException("no key accepted")


def _describe(exc: BaseException, timeout: float | None = None) -> str:
    """The cause in a few words; paramiko's texts can quote the server (a banner), so they are escaped."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out" + (f" after {timeout:.0f} s (connect timeout)" if timeout is not None else "")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return printable(type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}", 200)

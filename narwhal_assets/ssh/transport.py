"""Non-interactive SSH with paramiko: one verified connection per physical host, reused for every command.

The host key is checked against the checkout-local store right after key exchange and before any
credential is sent. There is no missing-host-key policy: paramiko's `SSHClient` is not used at all.
"""

from __future__ import annotations

import io
import select
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import paramiko

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.ssh.destination import Endpoint, identity_candidates, resolve_endpoint
from narwhal_assets.ssh.trust import HostKey, KnownHostsStore, TrustMode, Verdict

T = TypeVar("T")
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 300.0


class SshFailure(NarwhalError):
    """A host could not be reached or used; the message names host id, address and cause."""


@dataclass(frozen=True)
class HostAccess:
    """How to reach one physical host. The password never appears in repr, logs or errors."""

    host_id: str
    destination_env: str
    destination: str = field(repr=False)
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CommandResult:
    command: str
    rc: int
    stdout: bytes
    stderr: bytes
    seconds: float

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass
class HostConnection:
    """An authenticated transport to one host (plus the ProxyJump transports under it)."""

    access: HostAccess
    endpoint: Endpoint
    verdict: Verdict
    transport: paramiko.Transport
    hops: list[paramiko.Transport]
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT

    @property
    def host_id(self) -> str:
        return self.access.host_id

    @property
    def fingerprint(self) -> str:
        return self.verdict.fingerprint

    def run(self, command: str, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run `command` in the remote login shell, feeding `stdin`; bounded by `timeout` seconds."""
        limit = self.command_timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            channel = self.transport.open_session(timeout=limit)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = _drain(channel, started + limit)
            rc = channel.recv_exit_status() if channel.exit_status_ready() else -1
            channel.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._failure(f"command failed: {_describe(exc)}") from None
        if rc == -1:
            raise self._failure(f"command did not finish within {limit:.0f} s or the connection dropped")
        return CommandResult(command, rc, out, err, time.monotonic() - started)

    def put(self, data: bytes, remote_path: str, mode: int = 0o600) -> None:
        """Write `data` to `remote_path` (created with `mode` before any byte is written)."""
        try:
            sftp = paramiko.SFTPClient.from_transport(self.transport)
            if sftp is None:
                raise paramiko.SSHException("the server refused the SFTP subsystem")
            with sftp, sftp.open(remote_path, "wb") as handle:
                handle.chmod(mode)
                handle.write(data)
        except (paramiko.SSHException, OSError) as exc:
            raise self._failure(f"upload to {remote_path} failed: {_describe(exc)}") from None

    def close(self) -> None:
        self.transport.close()
        for hop in reversed(self.hops):
            hop.close()

    def _failure(self, cause: str) -> SshFailure:
        return SshFailure(f"host {self.host_id} ({self.endpoint.address}): {cause}")

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Connector:
    """Opens verified connections with one trust store and mode."""

    store: KnownHostsStore
    mode: TrustMode
    ssh_config: Path | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT

    def connect(self, access: HostAccess) -> HostConnection:
        """Verify the host key (and every ProxyJump hop's) against the store, then authenticate."""
        endpoint = self._endpoint(access)
        sock, hops = self._through_jumps(access, endpoint)
        try:
            transport, verdict = self._open(access, endpoint, sock, password=access.password)
        except BaseException:
            for hop in reversed(hops):
                hop.close()
            raise
        return HostConnection(access, endpoint, verdict, transport, hops, self.command_timeout)

    def map_hosts(
        self, accesses: list[HostAccess], work: Callable[[HostConnection], T], workers: int = 64
    ) -> dict[str, T | NarwhalError]:
        """Connect to every host in parallel and run `work` on each; failures are collected, not raised."""

        def one(access: HostAccess) -> T | NarwhalError:
            try:
                with self.connect(access) as connection:
                    return work(connection)
            except NarwhalError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(accesses)))) as pool:
            results = list(pool.map(one, accesses))
        return {access.host_id: result for access, result in zip(accesses, results, strict=True)}

    def presented_key(self, access: HostAccess) -> tuple[Endpoint, HostKey]:
        """The key the target presents, read after key exchange; no credential is sent to the target."""
        endpoint = self._endpoint(access)
        sock, hops = self._through_jumps(access, endpoint)
        try:
            transport, presented = self._handshake(access, endpoint, sock)
            transport.close()
            return endpoint, presented
        finally:
            for hop in reversed(hops):
                hop.close()

    def _endpoint(self, access: HostAccess) -> Endpoint:
        try:
            return resolve_endpoint(access.destination, self.ssh_config)
        except InputError as exc:
            raise InputError([f"host {access.host_id} ({access.destination_env}): {p}" for p in exc.problems]) from None

    def _through_jumps(
        self, access: HostAccess, endpoint: Endpoint
    ) -> tuple[paramiko.Channel | None, list[paramiko.Transport]]:
        """Open (and verify strictly or per mode) every ProxyJump hop; returns the channel to the target."""
        hops: list[paramiko.Transport] = []
        sock = None
        try:
            for jump in _flatten_jumps(endpoint):
                hop, _ = self._open(access, jump, sock, password=None, hop=True)
                hops.append(hop)
                sock = self._tunnel(access, hop, jump, endpoint)
        except BaseException:
            for hop in reversed(hops):
                hop.close()
            raise
        return sock, hops

    def _handshake(
        self, access: HostAccess, endpoint: Endpoint, sock: paramiko.Channel | None
    ) -> tuple[paramiko.Transport, HostKey]:
        where = f"host {access.host_id} ({endpoint.address})"
        try:
            raw = sock or socket.create_connection((endpoint.host, endpoint.port), timeout=self.connect_timeout)
        except OSError as exc:
            raise SshFailure(f"{where}: cannot connect: {_describe(exc)}") from None
        transport = paramiko.Transport(raw)
        try:
            transport.banner_timeout = self.connect_timeout
            transport.handshake_timeout = self.connect_timeout
            _prefer_key_types(transport, {k.key_type for k in self.store.keys_for(endpoint.host, endpoint.port)})
            transport.start_client(timeout=self.connect_timeout)
            key = transport.get_remote_server_key()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            transport.close()
            raise SshFailure(f"{where}: SSH handshake failed: {_describe(exc)}") from None
        return transport, HostKey(key.get_name(), key.get_base64())

    def _open(
        self,
        access: HostAccess,
        endpoint: Endpoint,
        sock: paramiko.Channel | None,
        password: str | None,
        *,
        hop: bool = False,
    ) -> tuple[paramiko.Transport, Verdict]:
        transport, presented = self._handshake(access, endpoint, sock)
        who, hop_of = (endpoint.alias, access.host_id) if hop else (access.host_id, None)
        try:
            verdict = self.store.verify(who, endpoint.host, endpoint.port, presented, self.mode, hop_of=hop_of)
            _authenticate(transport, endpoint, password, f"host {access.host_id} ({endpoint.address})")
            transport.set_keepalive(15)
        except BaseException:
            transport.close()
            raise
        return transport, verdict

    def _tunnel(
        self, access: HostAccess, hop: paramiko.Transport, jump: Endpoint, target: Endpoint
    ) -> paramiko.Channel:
        nxt = _next_after(target, jump)
        try:
            return hop.open_channel(
                "direct-tcpip", (nxt.host, nxt.port), ("127.0.0.1", 0), timeout=self.connect_timeout
            )
        except (paramiko.SSHException, OSError) as exc:
            raise SshFailure(
                f"host {access.host_id} ({nxt.address}): ProxyJump through {jump.address} failed: {_describe(exc)}"
            ) from None


def _flatten_jumps(endpoint: Endpoint) -> list[Endpoint]:
    """Hops in connection order, each hop's own jumps first (as OpenSSH chains ProxyJump)."""
    order: list[Endpoint] = []
    for jump in endpoint.jumps:
        order += _flatten_jumps(jump)
        order.append(jump)
    return order


def _next_after(target: Endpoint, jump: Endpoint) -> Endpoint:
    hops = [*_flatten_jumps(target), target]
    return hops[hops.index(jump) + 1]


def _prefer_key_types(transport: paramiko.Transport, known: set[str]) -> None:
    """Ask first for key types the store already holds for this host, as OpenSSH does."""
    if not known:
        return
    options = transport.get_security_options()
    current = list(options.key_types)
    wanted = [t for t in current if t in known or (t.startswith("rsa-sha2") and "ssh-rsa" in known)]
    options.key_types = wanted + [t for t in current if t not in wanted]


def _authenticate(transport: paramiko.Transport, endpoint: Endpoint, password: str | None, where: str) -> None:
    try:
        if password is not None:
            transport.auth_password(endpoint.user, password)
        else:
            _auth_keys(transport, endpoint)
    except paramiko.AuthenticationException:
        method = "password" if password is not None else "key/agent"
        raise SshFailure(f"{where}: authentication failed for user {endpoint.user} ({method})") from None
    if not transport.is_authenticated():
        raise SshFailure(f"{where}: authentication failed for user {endpoint.user}")


def _auth_keys(transport: paramiko.Transport, endpoint: Endpoint) -> None:
    keys: list[paramiko.PKey] = []
    if not endpoint.identities_only:
        keys += list(paramiko.Agent().get_keys())
    for path in identity_candidates(endpoint):
        key = _load_key(path)
        if key is not None:
            keys.append(key)
    for key in keys:
        try:
            transport.auth_publickey(endpoint.user, key)
            if transport.is_authenticated():
                return
        except paramiko.AuthenticationException:
            continue
    raise paramiko.AuthenticationException("no key accepted")


def _load_key(path: Path) -> paramiko.PKey | None:
    """Load an unencrypted private key of any type; encrypted or unreadable keys are skipped."""
    try:
        return paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, paramiko.SSHException, OSError, ValueError):
        return None


def _drain(channel: paramiko.Channel, deadline: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr until the command exits and both streams end, or the deadline passes."""
    out, err = io.BytesIO(), io.BytesIO()
    while True:
        if channel.recv_ready():
            out.write(channel.recv(65536))
        elif channel.recv_stderr_ready():
            err.write(channel.recv_stderr(65536))
        elif channel.exit_status_ready() and (channel.eof_received or channel.closed):
            return out.getvalue(), err.getvalue()
        elif channel.closed or time.monotonic() > deadline:
            channel.close()
            return out.getvalue(), err.getvalue()
        else:
            select.select([channel], [], [], min(0.5, max(0.0, deadline - time.monotonic())))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"

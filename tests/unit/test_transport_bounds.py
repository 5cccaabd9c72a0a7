"""Transport bounds against a misbehaving SSH server on loopback (a real paramiko server, not a mock): each
stalled step fails within its own bound and the message names that bound."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from narwhal_assets.ssh.transport import Connector, HostAccess, SshFailure
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode


class StallingServer(paramiko.ServerInterface):
    """Password auth that answers after `auth_delay` seconds; commands are accepted and never answered."""

    def __init__(self, auth_delay: float) -> None:
        self.auth_delay = auth_delay

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        time.sleep(self.auth_delay)
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[int, list[float]]]:
    """(port, auth delay setter) of a loopback SSH server serving every connection with StallingServer."""
    key_path = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)], check=True)
    host_key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    listener = socket.create_server(("127.0.0.1", 0))
    delay = [0.0]
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=StallingServer(delay[0]))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], delay
    listener.close()
    for transport in transports:
        transport.close()


def connector(tmp_path: Path, **bounds: float) -> Connector:
    return Connector(KnownHostsStore(tmp_path / "known_hosts"), TrustMode.ACCEPT_NEW, **bounds)  # type: ignore[arg-type]


def access(port: int) -> HostAccess:
    return HostAccess("node-1", "NARWHAL_NODE_1_SSH", f"u@[127.0.0.1]:{port}", password="pw")


def test_authentication_that_never_answers_fails_at_the_connect_timeout(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, delay = server
    delay[0] = 30.0
    with pytest.raises(SshFailure) as failure:
        connector(tmp_path, connect_timeout=1.0).connect(access(port))
    assert str(failure.value) == (
        f"host node-1 (127.0.0.1:{port}): authentication (password) did not finish within 1 s (connect timeout)"
    )


def test_a_command_that_never_answers_ends_at_the_host_timeout(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, _ = server
    bounded = connector(tmp_path, host_timeout=2.0, command_timeout=600.0)
    with bounded.connect(access(port)) as connection, pytest.raises(SshFailure) as failure:
        connection.run("true")
    assert str(failure.value) == f"host node-1 (127.0.0.1:{port}): the host did not finish within 2 s (host timeout)"


def test_the_host_timeout_still_ends_an_idle_connection(tmp_path: Path, server: tuple[int, list[float]]) -> None:
    """No keep-alive runs between commands, but the host's deadline does: it closes the idle connection."""
    port, _ = server
    bounded = connector(tmp_path, host_timeout=1.0, command_timeout=600.0)
    with bounded.connect(access(port)) as connection:
        deadline = time.monotonic() + 10
        while connection.transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not connection.transport.is_active()
        assert connection.watchdog and connection.watchdog.reason == "the host did not finish within 1 s (host timeout)"


def test_a_silent_tcp_peer_fails_the_handshake_at_the_connect_timeout(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(SshFailure) as failure:
            connector(tmp_path, connect_timeout=1.0).connect(access(port))
    assert f"host node-1 (127.0.0.1:{port}): SSH handshake failed: " in str(failure.value)

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

from narwhal_assets.core.errors import InputError, SshFailure
from narwhal_assets.ssh.transport import Connector, HostAccess
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
    assert str(failure.value) == (
        f"host node-1 (127.0.0.1:{port}): SSH handshake did not finish within 1 s (connect timeout)"
    )


RELAY = """
import os, select, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
os.set_blocking(0, False)
while True:
    ready, _, _ = select.select([0, sock], [], [])
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        sock.sendall(data)
    if sock in ready:
        data = sock.recv(65536)
        if not data:
            break
        os.write(1, data)
"""


def through(tmp_path: Path, port: int, *lines: str) -> Connector:
    """A connector whose ssh config sends `u@srv` to the loopback server with `lines` added."""
    config = tmp_path / "ssh_config"
    options = "".join(f"  {line}\n" for line in lines)
    config.write_text(f"Host srv\n  HostName 127.0.0.1\n  Port {port}\n{options}")
    return Connector(KnownHostsStore(tmp_path / "known_hosts"), TrustMode.ACCEPT_NEW, ssh_config=config,
                     connect_timeout=2.0)  # fmt: skip


SRV = HostAccess("node-1", "NARWHAL_NODE_1_SSH", "u@srv", password="pw")


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def test_a_proxycommand_carries_the_connection_and_is_killed_with_it(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, _ = server
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    connector = through(tmp_path, port, f"ProxyCommand python3 {relay} %h %p")
    with connector.connect(SRV) as connection:
        [proxy] = connection.route
        assert connection.transport.is_authenticated() and proxy.process.poll() is None
        pid = proxy.process.pid
    assert gone(pid), "the ProxyCommand outlived its connection"
    assert f"[127.0.0.1]:{port}" in (tmp_path / "known_hosts").read_text()


def test_a_proxycommand_that_exits_at_once_fails_with_its_status_and_stderr(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, _ = server
    connector = through(tmp_path, port, "ProxyCommand sh -c 'echo no route to %h for %n >&2; exit 3'")
    with pytest.raises(SshFailure) as failure:
        connector.connect(SRV)
    message = str(failure.value)
    assert message.startswith(f"host node-1 (127.0.0.1:{port}): SSH handshake failed: ")
    assert message.endswith("; ProxyCommand exited 3: no route to 127.0.0.1 for <NARWHAL_NODE_1_SSH>")
    assert not (tmp_path / "known_hosts").exists()


def test_a_proxycommand_that_hangs_is_stopped_at_the_connect_timeout(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, _ = server
    pid_file = tmp_path / "pid"
    connector = through(tmp_path, port, f"ProxyCommand sh -c 'echo $$ > {pid_file}; exec sleep 60'",
                        "ConnectTimeout 1")  # fmt: skip
    began = time.monotonic()
    with pytest.raises(SshFailure) as failure:
        connector.connect(SRV)
    assert time.monotonic() - began < 8
    assert str(failure.value).endswith(
        "SSH handshake did not finish within 1 s (connect timeout); ProxyCommand running"
    )
    assert gone(int(pid_file.read_text())), "the hanging ProxyCommand was not killed"


def test_algorithm_lists_are_applied_and_one_paramiko_cannot_meet_refuses_the_host(
    tmp_path: Path, server: tuple[int, list[float]]
) -> None:
    port, _ = server
    chosen = through(tmp_path, port, "Ciphers aes256-ctr,aes128-ctr", "MACs hmac-sha2-512",
                     "HostKeyAlgorithms ssh-ed25519", "KexAlgorithms diffie-hellman-group14-sha256")  # fmt: skip
    with chosen.connect(SRV) as connection:
        transport = connection.transport
        assert (transport.local_cipher, transport.local_mac) == ("aes256-ctr", "hmac-sha2-512")
        assert transport.host_key_type == "ssh-ed25519"
        offered = transport.get_security_options()
        assert (offered.ciphers, offered.digests) == (("aes256-ctr", "aes128-ctr"), ("hmac-sha2-512",))
        assert (offered.kex, offered.key_types) == (("diffie-hellman-group14-sha256",), ("ssh-ed25519",))
    unmet = through(tmp_path, port, "Ciphers chacha20-poly1305@openssh.com")
    with pytest.raises(InputError) as refused:
        unmet.connect(SRV)
    assert str(refused.value).startswith(
        f"host node-1 (NARWHAL_NODE_1_SSH): Ciphers chacha20-poly1305@openssh.com (ssh config {tmp_path}/ssh_config): "
        "none of these is implemented by paramiko"
    )


def test_connect_timeout_in_the_config_is_bounded_by_ours(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        shorter = through(tmp_path, port, "ConnectTimeout 1")
        began = time.monotonic()
        with pytest.raises(SshFailure, match="SSH handshake did not finish within 1 s"):
            shorter.connect(SRV)
        assert time.monotonic() - began < 5
        longer = through(tmp_path, port, "ConnectTimeout 600")  # ours (2 s) wins
        with pytest.raises(SshFailure, match="SSH handshake did not finish within 2 s"):
            longer.connect(SRV)


@pytest.mark.parametrize(("option", "password"), [("PubkeyAuthentication no", None),
                                                  ("PasswordAuthentication no", "pw"),
                                                  ("PreferredAuthentications keyboard-interactive,publickey", "pw")])
def test_a_config_that_turns_off_the_hosts_one_method_refuses_it_before_connecting(
    tmp_path: Path, option: str, password: str | None
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # nothing may connect: refused first
        connector = through(tmp_path, silent.getsockname()[1], option)
        silent.settimeout(0.1)
        with pytest.raises(InputError) as refused:
            connector.connect(HostAccess("node-1", "NARWHAL_NODE_1_SSH", "u@srv", password=password))
        with pytest.raises(TimeoutError):
            silent.accept()
    method = "password" if password else "publickey"
    assert str(refused.value).startswith(f"host node-1 (NARWHAL_NODE_1_SSH): {option.split()[0]} ")
    assert str(refused.value).endswith(f"(ssh config {tmp_path}/ssh_config): turns off {method} authentication, "
                                       "the only method these connections can use for this host")

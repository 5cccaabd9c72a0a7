"""Every route and identity an OpenSSH config can name, against real sshd hosts: discover, install,
status and shell agree with each other and with plain OpenSSH on where each host is and under which name its
key is pinned.

One fleet for the module, each host reachable only the way its alias says:

- `bast`: the bastion, reached directly;
- `pc` (behind bast, no link of its own): only through a ProxyCommand, `ssh -W %h:%p bast`;
- `hopbox` (behind bast): through the same ProxyCommand; `jt` (behind hopbox): by ProxyJump over hopbox, a
  jump hop with its own ProxyCommand: workstation -> ssh -W via bast -> hopbox (verified here) -> jt;
- `cert`: accepts only a user certificate signed by the test CA (sshd TrustedUserCAKeys, no authorized key),
  reached on a non-22 port (a loopback relay);
- `ka`: under a HostKeyAlias, also on a non-22 port: its key is pinned under the alias alone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleetsim import SimFleet
from fleetsim.hardware import DEFAULT_IMAGE_REF
from helpers.deploy_hosts import cli, failing_discover, prepare
from helpers.fleet_checkout import MODEL, MODEL_CONFIG, MODEL_DIR, WEIGHTS
from helpers.git_repo import git_checkout
from helpers.install import OFFLINE_CHECK, SLOW_INSTALL, install, outcomes

from narwhal_assets.core.errors import SshFailure
from narwhal_assets.ssh.transport import Connector, HostAccess
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode

ROLES = {"router": "bast-node", "engine-1": "pc-node", "engine-2": "hopbox-node", "engine-3": "jt-node",
         "engine-4": "cert-node", "engine-5": "ka-node"}  # fmt: skip
HOST_IDS = {alias: role.replace("engine-", "node-") for role, alias in ROLES.items()}  # router-only: "router"


class Relay:
    """A TCP relay on 127.0.0.1 to one host's sshd: that host on a port other than 22."""

    def __init__(self, address: str, port: int = 22) -> None:
        self.target = (address, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    sink.sendall(data)
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def user_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test CA's private key (its `.pub` beside it): the certificate host trusts it."""
    ca = tmp_path_factory.mktemp("ca") / "user_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    return ca


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet], user_ca: Path) -> SimFleet:
    ca = user_ca
    fleet = sim_fleet_factory()
    fleet.add_host("bast")
    fleet.add_host("pc", via="bast")
    fleet.add_host("hopbox", via="bast")
    fleet.add_host("jt", via="hopbox")
    fleet.add_host("cert", authorize_client_key=False, trusted_user_ca=ca.with_suffix(".pub").read_text())
    fleet.add_host("ka")
    fleet.start()
    fleet.write_model(MODEL, WEIGHTS, MODEL_CONFIG)
    return fleet


@pytest.fixture(scope="module")
def relays(fleet: SimFleet) -> Iterator[dict[str, Relay]]:
    found = {name: Relay(fleet.host(name).address) for name in ("cert", "ka")}
    yield found
    for relay in found.values():
        relay.close()


@pytest.fixture(scope="module")
def routes(
    fleet: SimFleet, relays: dict[str, Relay], user_ca: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The operator's ssh config: one alias per route, and (Host *) the operator's own known-hosts file for
    plain `ssh`, which the plain-OpenSSH test fills from the checkout store."""
    home = tmp_path_factory.mktemp("operator")
    config = home / "ssh_config"
    key = home / "cert_id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    certificate = home / "certs" / "user.pub"
    certificate.parent.mkdir()
    shutil.copy(key.with_suffix(".pub"), certificate)
    subprocess.run(["ssh-keygen", "-q", "-s", str(user_ca), "-I", "narwhal-test", "-n", fleet.host("cert").user,
                    str(certificate)], check=True)  # fmt: skip
    via_bast = (f"ssh -F {config} -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile="
                f"{home}/bastion_known_hosts -o GlobalKnownHostsFile=/dev/null -W %h:%p bast-node")  # fmt: skip
    blocks = {
        "bast-node": ["HostName {bast}"],
        "pc-node": ["HostName {pc}", f"ProxyCommand {via_bast}"],
        "hopbox-node": ["HostName {hopbox}", f"ProxyCommand {via_bast}"],
        "jt-node": ["HostName {jt}", "ProxyJump hopbox-node"],
        "cert-node": ["HostName 127.0.0.1", f"Port {relays['cert'].port}", f"IdentityFile {key}",
                      f"CertificateFile {home}/certs/user-cert.pub"],
        "ka-node": ["HostName 127.0.0.1", f"Port {relays['ka'].port}", "HostKeyAlias KA-Node.Fleet"],
    }
    text = []
    for alias, lines in blocks.items():
        name = alias.removesuffix("-node")
        host = fleet.host(name)
        lines = [line.format(**{n: fleet.host(n).address for n in fleet.hosts}) for line in lines]
        text.append("\n    ".join([f"Host {alias}", *lines, f"User {host.user}"]))
    text.append(f"Host *\n    IdentityFile {fleet.client_key_path}\n    IdentitiesOnly yes\n"
                f"    UserKnownHostsFile {home}/plain_known_hosts\n    StrictHostKeyChecking yes\n"
                "    GlobalKnownHostsFile /dev/null\n    BatchMode yes\n")  # fmt: skip
    config.write_text("\n".join(text) + "\n")
    return config


def write_checkout(root: Path, config: Path, roles: dict[str, str] = ROLES) -> Path:
    root.mkdir(parents=True)
    lines = [f"{'NARWHAL_ROUTER_SSH' if role == 'router' else f'NARWHAL_NODE_{role[7:]}_SSH'}={alias}"
             for role, alias in roles.items()]  # fmt: skip
    lines += [f"NARWHAL_SSH_CONFIG={config}", f"NARWHAL_ENGINE_IMAGE={DEFAULT_IMAGE_REF}",
              f"NARWHAL_ENGINE_MODEL_NAME={MODEL}", f"NARWHAL_MODEL_DIR={MODEL_DIR}",
              "NARWHAL_RUN_DIR=/var/tmp/narwhal-run", "NARWHAL_FABRIC_INTERFACE=fab0"]  # fmt: skip
    (root / ".env").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def discovered(
    fleet: SimFleet, routes: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str, str]]:
    """A checkout discovered over every route: (root, discover's stdout, its stderr)."""
    root = write_checkout(tmp_path_factory.mktemp("routes") / "checkout", routes)
    revision = git_checkout(root)
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("NARWHAL_")]:
            patch.delenv(name)
        patch.setenv("DAGSTER_HOME", str(root.parent / "dagster"))
        capture = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), "discover"],
                                 capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        with (root / ".env").open("a", encoding="utf-8") as env:
            for name, value in (("NARWHAL_DEPLOYMENT_REVISION", revision), ("NARWHAL_REMOTE_INSTALL", SLOW_INSTALL),
                                ("NARWHAL_REMOTE_CHECK", OFFLINE_CHECK)):  # fmt: skip
                env.write(f"{name}={shlex.quote(value)}\n")
        yield root, capture.stdout, capture.stderr


def test_the_routes_are_the_only_way_in(fleet: SimFleet) -> None:
    for name in ("pc", "hopbox", "jt"):
        with pytest.raises(OSError):
            socket.create_connection((fleet.host(name).address, 22), timeout=1).close()


def test_discover_install_status_and_shell_over_every_route(
    discovered: tuple[Path, str, str], fleet: SimFleet, relays: dict[str, Relay], capsys: pytest.CaptureFixture[str]
) -> None:
    root, out, err = discovered
    assert "discovery run " in out, out + err
    store = (root / "config" / "ssh.known_hosts").read_text()
    names = {line.split()[0] for line in store.splitlines() if line.strip()}
    expected = {fleet.host(n).address for n in ("bast", "pc", "hopbox", "jt")}
    expected |= {f"[127.0.0.1]:{relays['cert'].port}", "ka-node.fleet"}
    assert names == expected, "keys are pinned under the names OpenSSH looks up (HostKeyAlias alone, no port)"

    rc, out, err = cli(root, "check-access", capsys=capsys)
    assert rc == 0, out + err
    assert all(f" {host_id} " in out for host_id in HOST_IDS.values())
    run = prepare(root, capsys)
    rc, out, err = install(root, run, capsys)
    assert rc == 0, out + err
    assert set(outcomes(out).values()) == {"installed"} and len(outcomes(out)) == len(HOST_IDS)
    rc, out, err = cli(root, "status", capsys=capsys)
    assert rc == 0, out + err
    assert all(host_id in out for host_id in HOST_IDS.values())
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    for role, alias in ROLES.items():
        host = fleet.host(alias.removesuffix("-node"))
        done = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), "shell", "--current",
                               "--role", role, "--command", 'printf "%s@%s" "$USER" "$(hostname)"'], env=env,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, f"{role}: {done.stderr}"
        assert done.stdout == f"{host.user}@{host.name}", role


def test_plain_openssh_accepts_the_checkout_store_for_every_host(
    discovered: tuple[Path, str, str], routes: Path
) -> None:
    """`ssh -F <config> -o UserKnownHostsFile=config/ssh.known_hosts -o StrictHostKeyChecking=yes <alias>
    true`, for every host. OpenSSH passes no `-o` to the ssh it starts for a ProxyJump hop, so the hop (here
    hopbox, on jt's route) is checked against the config's own UserKnownHostsFile: the test makes that a copy
    of the checkout store, which proves the hop's entry is under the name OpenSSH looks up too."""
    root, _, _ = discovered
    store = root / "config" / "ssh.known_hosts"
    shutil.copy(store, routes.parent / "plain_known_hosts")
    for alias in ROLES.values():
        done = subprocess.run(["ssh", "-F", str(routes), "-o", f"UserKnownHostsFile={store}", "-o",
                               "StrictHostKeyChecking=yes", alias, "true"], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, f"{alias}: {done.stderr}"
    empty = routes.parent / "empty_known_hosts"
    empty.write_text("")
    refused = subprocess.run(["ssh", "-F", str(routes), "-o", f"UserKnownHostsFile={empty}", "-o",
                              "StrictHostKeyChecking=yes", "ka-node", "true"], capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_only_a_certificate_opens_the_certificate_host(
    fleet: SimFleet, routes: Path, relays: dict[str, Relay], tmp_path: Path
) -> None:
    """The certificate, offered explicitly (CertificateFile) or as `<IdentityFile>-cert.pub`; the same key
    without its certificate is refused."""
    home = routes.parent
    implicit = tmp_path / "id"
    shutil.copy(home / "cert_id", implicit)
    shutil.copy(home / "certs" / "user-cert.pub", tmp_path / "id-cert.pub")
    config = tmp_path / "config"
    host = f"HostName 127.0.0.1\n  Port {relays['cert'].port}\n  User {fleet.host('cert').user}\n  IdentitiesOnly yes"
    config.write_text(f"Include {routes}\nHost implicit\n  {host}\n  IdentityFile {implicit}\n"
                      f"Host bare\n  {host}\n  IdentityFile {home / 'cert_id'}\n")  # fmt: skip
    connector = Connector(KnownHostsStore(tmp_path / "kh"), TrustMode.ACCEPT_NEW, ssh_config=config)
    for alias in ("cert-node", "implicit"):
        with connector.connect(HostAccess("node-4", "NARWHAL_NODE_4_SSH", alias)) as connection:
            assert connection.run("id -un").text().strip() == fleet.host("cert").user
    with pytest.raises(SshFailure, match=r"authentication failed for user \S+ \(key/agent\)$"):
        connector.connect(HostAccess("node-4", "NARWHAL_NODE_4_SSH", "bare"))


def test_bad_routes_fail_their_host_with_one_line_and_write_nothing(
    fleet: SimFleet, routes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ProxyCommand that exits at once or hangs, a certificate that is not there: that host fails with one
    line naming why; the discovery publishes nothing (the good host's key is not recorded either)."""
    pid_file = tmp_path / "hanging.pid"
    config = tmp_path / "config"
    cert = fleet.host("cert")
    config.write_text(
        f"Include {routes}\n"
        "Host exits\n  HostName 127.0.0.1\n  ProxyCommand sh -c 'echo bastion refused us >&2; exit 5'\n"
        f"Host hangs\n  HostName 127.0.0.1\n  ConnectTimeout 2\n  ProxyCommand sh -c 'echo $$ > {pid_file}; "
        "exec sleep 600'\n"
        f"Host nocert\n  HostName {cert.address}\n  User {cert.user}\n  IdentityFile {routes.parent / 'cert_id'}\n"
        f"  CertificateFile {tmp_path}/missing-cert.pub\n"
    )  # fmt: skip
    root = write_checkout(tmp_path / "checkout", config, {"router": "bast-node", "engine-1": "exits",
                                                          "engine-2": "hangs", "engine-3": "nocert"})  # fmt: skip
    err, _ = failing_discover(root, capsys, rc=1)
    lines = err.strip().splitlines()
    assert any(line.endswith("ProxyCommand exited 5: bastion refused us") and "node-1" in line for line in lines)
    assert any("node-2" in line and "SSH handshake did not finish within 2 s (connect timeout); ProxyCommand "
               "running" in line for line in lines), err  # fmt: skip
    assert any("node-3" in line and line.endswith(f"(key/agent); not found: CertificateFile {tmp_path}/"
                                                  "missing-cert.pub") for line in lines), err  # fmt: skip
    assert "host router" not in err and "Traceback" not in err
    assert not (root / "config" / "ssh.known_hosts").exists() and not (root / "config" / "deployment.env").exists()
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists(), "the hanging ProxyCommand was left running"


def test_a_config_openssh_rejects_fails_discovery_naming_it_and_writes_nothing(
    routes: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    config.write_text(routes.read_text().replace("Host *\n", "Host *\n    UseKeychain yes\n"))
    root = write_checkout(tmp_path / "checkout", config, {"engine-1": "bast-node", "engine-2": "pc-node"})
    err, _ = failing_discover(root, capsys, rc=2)
    assert f"ssh config {config}: OpenSSH refuses it: {config}: line" in err and "Bad configuration option" in err
    assert "Traceback" not in err
    assert not (root / "config" / "ssh.known_hosts").exists()

"""SSH transport and checkout-local trust store against real sshd hosts (issue: SSH and trust).

Layout of the shared fleet: h1 (router + engine-1, key auth), h2 (engine-2, password auth), h3 (engine-3,
reachable only through h1 by ProxyJump), h4..h6 (engines 4..6, key auth). Tests that break a host
(rotate its key, stop it, cut its link) use their own small fleet or restore the host before returning.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pexpect
import pytest
from fleetsim import SimFleet
from helpers.dagster_dev import group_members
from helpers.polling import wait_for

from narwhal_assets.cli.main import main
from narwhal_assets.core.errors import NarwhalError, SshFailure
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.runtime.runner import run_job
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import openssh_command
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode

PASSWORD = "pw-SENTINEL-7f3a9c"
ROLES = {"router": "h1", "engine-1": "h1", "engine-2": "h2", "engine-3": "h3", "engine-4": "h4",
         "engine-5": "h5", "engine-6": "h6"}  # fmt: skip
HOST_IDS = {"h1": "node-1", "h2": "node-2", "h3": "node-3", "h4": "node-4", "h5": "node-5", "h6": "node-6"}


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    fleet = sim_fleet_factory()
    fleet.add_host("h1")
    fleet.add_host("h2", password=PASSWORD)
    fleet.add_host("h3", via="h1")
    for name in ("h4", "h5", "h6"):
        fleet.add_host(name)
    fleet.start()
    return fleet


def make_checkout(root: Path, fleet: SimFleet, roles: dict[str, str] = ROLES) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".env").write_text("\n".join(fleet.env_lines(roles)) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def checkout(tmp_path: Path, fleet: SimFleet) -> Path:
    return make_checkout(tmp_path / "checkout", fleet)


def cli(root: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--root", str(root), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def enrol(root: Path) -> dict[str, dict[str, str]]:
    """Materialize the trust store alone (accept-new); returns its `fingerprints` metadata."""
    # The persistent instance at DAGSTER_HOME (a tmp dir here), as the CLI would run it.
    result = run_job(root, "discovery_job", "test", assets=["host_inventory", "ssh_known_hosts"])
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey("ssh_known_hosts")]
    return event.materialization.metadata["fingerprints"].value


def enrolled_pair(factory: Callable[..., SimFleet], root: Path, via: str | None = None) -> tuple[SimFleet, Path]:
    """A fresh two-host fleet of its own (for tests that break a host), enrolled in a new checkout."""
    fleet = factory()
    fleet.add_host("h1")
    fleet.add_host("h2", via=via)
    fleet.start()
    root = make_checkout(root, fleet, {"engine-1": "h1", "engine-2": "h2"})
    enrol(root)
    return fleet, root


def store_of(root: Path) -> KnownHostsStore:
    return KnownHostsStore(root / "config" / "ssh.known_hosts")


def recorded(root: Path, fleet: SimFleet, name: str) -> set[str]:
    host = fleet.host(name)
    return set(store_of(root).fingerprints(host.address, host.port))


def test_first_contact_records_keys_then_strict_access_passes(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    fingerprints = enrol(checkout)
    for name, host_id in HOST_IDS.items():
        served = set(fleet.host(name).host_key_fingerprints().values())
        assert recorded(checkout, fleet, name) <= served and recorded(checkout, fleet, name)
        assert fingerprints[host_id]["fingerprint"] in served
        assert fingerprints[host_id]["outcome"] == "added"
    assert oct((checkout / "config" / "ssh.known_hosts").stat().st_mode & 0o777) == "0o600"

    rc, out, err = cli(checkout, "check-access", capsys=capsys)
    assert rc == 0, err
    for name, host_id in HOST_IDS.items():
        line = next(line for line in out.splitlines() if f" {host_id} " in line)
        assert "hostname=" in line and "key=SHA256:" in line
        assert line.split("key=")[1] in fleet.host(name).host_key_fingerprints().values()

    assert {v["outcome"] for v in enrol(checkout).values()} == {"known"}


def test_unknown_host_is_refused_in_strict_mode(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = cli(checkout, "check-access", "--host", "node-4", capsys=capsys)
    assert rc == 1
    assert "host node-4" in err and "is not in" in err and "deploy-hosts discover" in err
    assert not (checkout / "config" / "ssh.known_hosts").exists()


def test_rotated_key_is_refused_in_both_modes_and_trust_replaces_only_that_entry(
    tmp_path: Path, sim_fleet_factory: Callable[..., SimFleet], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, root = enrolled_pair(sim_fleet_factory, tmp_path / "rot")
    store_path = root / "config" / "ssh.known_hosts"
    before = store_path.read_bytes()
    old = recorded(root, fleet, "h1")
    fleet.rotate_host_key("h1")
    new = set(fleet.host("h1").host_key_fingerprints().values())
    assert not old & new

    with pytest.raises(NarwhalError) as changed:
        enrol(root)
    message = str(changed.value)
    assert f"host node-1 ({fleet.host('h1').address}:22)" in message and "HOST KEY CHANGED" in message
    assert any(fp in message for fp in old) and any(fp in message for fp in new)
    assert "deploy-hosts trust --host node-1 --fingerprint SHA256:" in message
    assert store_path.read_bytes() == before

    rc, out, err = cli(root, "check-access", capsys=capsys)
    assert rc == 1 and "HOST KEY CHANGED" in err and "node-1" not in out
    assert store_path.read_bytes() == before

    wrong = next(iter(old))
    rc, _, err = cli(root, "trust", "--host", "node-1", "--fingerprint", wrong, capsys=capsys)
    assert rc == 1 and "does not match the verified fingerprint" in err
    assert store_path.read_bytes() == before

    presented = message.split("the server presented ")[1].split()[1].rstrip(".")
    rc, _, err = cli(root, "trust", "--host", "node-1", "--fingerprint", presented, capsys=capsys)
    assert rc == 0, err
    after = store_path.read_text()
    h2_lines = [line for line in before.decode().splitlines() if line.startswith(fleet.host("h2").address + " ")]
    assert h2_lines and all(line in after.splitlines() for line in h2_lines)
    assert recorded(root, fleet, "h1") == {presented}
    rc, _, err = cli(root, "check-access", capsys=capsys)
    assert rc == 0, err


ENROL_SCRIPT = """
import sys
from pathlib import Path
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.trust import TrustMode
root, hosts = Path(sys.argv[1]), sys.argv[2].split(",")
settings = Settings.load(root)
entries = [e for e in Checkout.from_settings(settings).inventory.hosts if e.id in hosts]
connector = make_connector(settings, TrustMode.ACCEPT_NEW)
results = connector.map_hosts(host_accesses(settings, entries), lambda c: c.verdict.outcome)
bad = {h: str(r) for h, r in results.items() if not isinstance(r, str)}
sys.exit(f"failed: {bad}" if bad else 0)
"""


def test_two_processes_enrolling_at_once_lose_no_entry(tmp_path: Path, fleet: SimFleet) -> None:
    for round_number in range(3):
        root = make_checkout(tmp_path / f"round{round_number}", fleet)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
        procs = [
            subprocess.Popen([sys.executable, "-c", ENROL_SCRIPT, str(root), hosts], env=env, stderr=subprocess.PIPE)
            for hosts in ("node-1,node-4,node-5", "node-2,node-6,node-3")
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
        for name in HOST_IDS:
            assert len(recorded(root, fleet, name)) == 1, f"round {round_number}: {name} lost"
        lines = [line for line in (root / "config" / "ssh.known_hosts").read_text().splitlines() if line]
        assert len(lines) == len(HOST_IDS)


def openssh_strict(fleet: SimFleet, store: Path, name: str) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-F", str(fleet.ssh_config_path), "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={store}", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5", name, "echo ok"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_openssh_accepts_our_entries_including_proxyjump(checkout: Path, fleet: SimFleet) -> None:
    enrol(checkout)
    store = checkout / "config" / "ssh.known_hosts"
    for name in ("h1", "h4"):
        done = openssh_strict(fleet, store, name)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    settings = Settings.load(checkout)
    endpoint = resolve_endpoint("h3", settings.ssh_config_path)
    command = openssh_command(endpoint, store, remote_command="echo via-$USER")
    argv = [a for a in command.argv if a != "-t"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"via-{fleet.host('h3').user}", done.stderr


def test_openssh_strict_refuses_a_store_without_the_host(checkout: Path, fleet: SimFleet) -> None:
    store = checkout / "empty_known_hosts"
    store.write_text("")
    done = openssh_strict(fleet, store, "h4")
    assert done.returncode != 0 and "Host key verification failed" in done.stderr


def test_we_honour_hashed_and_bracketed_entries_written_by_openssh(
    tmp_path: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "openssh_known_hosts"
    local_port = free_port()
    forward = subprocess.Popen(
        ["ssh", "-F", str(fleet.ssh_config_path), "-o", f"UserKnownHostsFile={store}", "-o",
         "StrictHostKeyChecking=accept-new", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HashKnownHosts=yes",
         "-o", "BatchMode=yes", "-N", "-L", f"127.0.0.1:{local_port}:{fleet.host('h4').fabric_address}:22", "h1"],
        start_new_session=True,  # its group is ended below, whatever it started
    )  # fmt: skip
    try:
        wait_port(local_port, forward)
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Include {fleet.ssh_config_path}\nHost h4-tunnel\n  HostName 127.0.0.1\n  Port {local_port}\n"
            f"  User {fleet.host('h4').user}\n  IdentityFile {fleet.client_key_path}\n  IdentitiesOnly yes\n"
        )
        opened = subprocess.run(
            ["ssh", "-F", str(config), "-o", f"UserKnownHostsFile={store}", "-o", "StrictHostKeyChecking=accept-new",
             "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HashKnownHosts=yes", "-o", "BatchMode=yes",
             "h4-tunnel", "true"], capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert opened.returncode == 0, opened.stderr
        text = store.read_text()
        assert text.count("|1|") >= 2 and str(local_port) not in text and "127.0.0.1" not in text
        root = tmp_path / "hashed"
        root.mkdir()
        (root / ".env").write_text(
            f"NARWHAL_NODE_1_SSH=h1\nNARWHAL_NODE_4_SSH=h4-tunnel\nNARWHAL_SSH_CONFIG={config}\n"
            f"NARWHAL_SSH_KNOWN_HOSTS={store}\n"
        )
        before = store.read_bytes()
        rc, out, err = cli(root, "check-access", capsys=capsys)
        assert rc == 0, err
        assert "node-4" in out and "node-1" in out
        assert store.read_bytes() == before
    finally:
        end_group(forward)


def test_password_auth_keeps_the_password_out_of_argv_environ_and_logs(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    enrol(checkout)
    settings = Settings.load(checkout)
    entry = Checkout.from_settings(settings).inventory.host("node-2")
    assert entry.password_env == "NARWHAL_NODE_2_SSH_PASSWORD"
    connector = make_connector(settings, TrustMode.STRICT)
    with connector.connect(host_accesses(settings, [entry])[0]) as connection:
        assert connection.run("echo $USER").text().strip() == fleet.host("h2").user
        long_running = connection.run("sleep 0.5; echo done")
        assert long_running.rc == 0
        assert PASSWORD not in repr(connection.access)
    assert_nowhere(PASSWORD, [checkout], dagster_home=Path(os.environ["DAGSTER_HOME"]))


def assert_nowhere(secret: str, roots: list[Path], dagster_home: Path | None = None) -> None:
    """The secret is in no process's argv or environment and in no file under `roots` (but .env)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        for name in ("cmdline", "environ"):
            try:
                data = (proc / name).read_bytes()
            except OSError:
                continue
            assert secret.encode() not in data, f"secret in /proc/{proc.name}/{name}"
    for root in [*roots, *([dagster_home] if dagster_home else [])]:
        for path in root.rglob("*"):
            if path.is_file() and path.name != ".env":
                assert secret.encode() not in path.read_bytes(), f"secret in {path}"


def assert_handed_over_by_pipe(pid: int, secret: str) -> None:
    """The running processes' view of the handover (test_openssh checks the same rules on the argv and fd
    before exec): `sshpass -d FD` with FD a pipe, and no process holds an open file containing the secret."""
    argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    assert argv[:2] == [b"sshpass", b"-d"], argv[:3]
    with contextlib.suppress(FileNotFoundError):  # sshpass may have closed it after reading
        assert os.readlink(f"/proc/{pid}/fd/{int(argv[2])}").startswith("pipe:")
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            opened = fd.stat()  # the open file itself, even when its name was deleted
            data = fd.read_bytes() if stat.S_ISREG(opened.st_mode) and opened.st_size < (1 << 20) else b""
        except OSError:
            continue
        assert secret.encode() not in data, f"{fd} (an open file) holds the secret"


def test_proxyjump_reaches_a_host_only_through_its_bastion(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(OSError):
        socket.create_connection((fleet.host("h3").address, 22), timeout=2).close()
    enrol(checkout)
    rc, out, err = cli(checkout, "check-access", "--role", "engine-3", capsys=capsys)
    assert rc == 0, err
    assert "node-3" in out and "node-1" not in out


def test_stopped_host_and_cut_link_fail_clearly_and_bounded_while_others_succeed(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    enrol(checkout)
    fleet.stop_host("h5")
    fleet.cut_link("h6")
    try:
        started = time.monotonic()
        rc, out, err = cli(checkout, "check-access", "--timeout", "3", capsys=capsys)
        elapsed = time.monotonic() - started
    finally:
        fleet.start_host("h5")
        fleet.restore_link("h6")
    assert rc == 1
    assert "node-5" in err and "connection refused" in err
    assert "node-6" in err and "timed out" in err
    for host_id in ("node-1", "node-2", "node-3", "node-4"):
        assert any(line.startswith("ok") and f" {host_id} " in line for line in out.splitlines())
    assert elapsed < 20, f"check-access took {elapsed:.1f}s with a 3 s timeout"


def test_a_killed_sshd_mid_command_is_a_bounded_error(
    tmp_path: Path, sim_fleet_factory: Callable[..., SimFleet]
) -> None:
    fleet, root = enrolled_pair(sim_fleet_factory, tmp_path / "kill")
    settings = Settings.load(root)
    entry = Checkout.from_settings(settings).inventory.host("node-1")
    connector = make_connector(settings, TrustMode.STRICT, command_timeout=20)
    with connector.connect(host_accesses(settings, [entry])[0]) as connection:
        started = time.monotonic()
        threading.Timer(1.0, fleet.kill_sshd, args=("h1",)).start()
        with pytest.raises(SshFailure) as failure:
            connection.run("sleep 60")
        assert time.monotonic() - started < 20
    assert "host node-1" in str(failure.value)


def test_shell_for_a_password_host_opens_an_interactive_session(checkout: Path, fleet: SimFleet) -> None:
    enrol(checkout)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env["PS1"] = "$ "
    child = pexpect.spawn(
        sys.executable, ["-m", "narwhal_assets", "--root", str(checkout), "shell", "--role", "engine-2"],
        env=env, encoding="utf-8", timeout=20,
    )  # fmt: skip
    try:
        child.sendline("echo marker-$USER-$((6*7))")
        child.expect(f"marker-{fleet.host('h2').user}-42")
        assert_nowhere(PASSWORD, [checkout])
        assert_handed_over_by_pipe(child.pid, PASSWORD)
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize("role", ["engine-4", "engine-3"])  # engine-3: h3, only through its bastion h1
def test_tunnel_forwards_a_local_port_to_the_role_host(
    checkout: Path, fleet: SimFleet, tmp_path: Path, role: str
) -> None:
    """The tunnel forwards; SIGTERM ends it promptly and leaves nothing running, its ProxyJump hop included,
    even started as `nohup` would (SIGHUP ignored, which is how ssh ends a hop)."""
    enrol(checkout)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    with (tmp_path / "tunnel.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "tunnel", "--role", role,
             "--forward", f"{port}:22"], env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        )  # fmt: skip
    try:
        wait_port(port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            assert sock.recv(64).startswith(b"SSH-2.0-OpenSSH")
        hops = [pid for pid in group_members(proc.pid) if b"\0-W\0" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(hops) == (role == "engine-3"), hops  # `ssh ... -W '[%h]:%p' h1` for h3 alone
        proc.terminate()  # the tunnel alone: ending what it started is its own job
        proc.wait(timeout=30)  # ssh -N exits 0 on SIGTERM
        wait_for(lambda: not group_members(proc.pid), "the tunnel's ssh and hop to end", limit=30)
    finally:
        end_group(proc)
    assert "Traceback" not in (tmp_path / "tunnel.err").read_text()


def end_group(process: subprocess.Popen[bytes]) -> None:
    """Clean-up: SIGKILL whatever is left of the session `process` leads, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def test_changed_key_on_a_bastion_refuses_the_host_behind_it(
    tmp_path: Path, sim_fleet_factory: Callable[..., SimFleet], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, root = enrolled_pair(sim_fleet_factory, tmp_path / "bastion", via="h1")
    fleet.rotate_host_key("h1")
    rc, _, err = cli(root, "check-access", "--host", "node-2", capsys=capsys)
    assert rc == 1 and "HOST KEY CHANGED" in err
    assert f"ProxyJump hop h1 of host node-2 ({fleet.host('h1').address}:22)" in err
    assert f"--host <id of the inventory host at {fleet.host('h1').address}>" in err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, process: subprocess.Popen[bytes], limit: float = 120) -> None:
    """Until `port` accepts a connection; fails at once if `process` (what should open it) exits."""

    def opened() -> bool:
        assert process.poll() is None, f"exited {process.returncode} before port {port} opened"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_for(opened, f"port {port} to open", limit=limit)


def test_a_key_that_needs_a_passphrase_is_skipped_for_the_next_identity(
    tmp_path: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Most operators' first key has a passphrase (and sits in an agent): it is passed over, not a crash,
    and the next identity authenticates."""
    locked = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(locked)], check=True)
    host = fleet.host("h4")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host h4-locked-first\n  HostName {host.address}\n  User {host.user}\n  IdentityFile {locked}\n"
                      f"  IdentityFile {fleet.client_key_path}\n  IdentitiesOnly yes\n")  # fmt: skip
    root = tmp_path / "locked-first"
    root.mkdir()
    (root / ".env").write_text(f"NARWHAL_NODE_1_SSH=h4-locked-first\nNARWHAL_SSH_CONFIG={config}\n")
    enrol(root)
    rc, out, err = cli(root, "check-access", capsys=capsys)
    assert rc == 0, out + err
    assert "node-1" in out and "Traceback" not in err

"""The simulated fleet: real sshd hosts with their own identity, faults on demand, and clean removal.

Every connection goes to a 198.18.0.0/15 address of the fleet's own hosts; host keys are trusted only
through per-test known_hosts files with accept-new.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetsim import FleetError, SimFleet, fake_docker, fake_nvidia_smi, hardware, network
from fleetsim import fleet as fleet_module
from fleetsim.client import FleetSsh
from fleetsim.state import FleetState

from narwhal_assets.core.inputs.envfile import parse_env_text

FLEET_SPACE = ipaddress.ip_network("198.18.0.0/15")
PASSWORD = "demo pass: 'quoted' & $not-expanded"
QUERY = "nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits"
PROBE = "echo $USER; hostname; ip -o addr show fab0; " + QUERY + "; docker image inspect {image}"
Factory = Callable[..., SimFleet]
MakeSsh = Callable[[SimFleet], FleetSsh]


@pytest.fixture(scope="module")
def demo(sim_fleet_factory: Factory) -> Iterator[SimFleet]:
    """The README layout: h1 key + RDMA, h2 password, h3 key and reachable only through h1."""
    fleet = sim_fleet_factory()
    fleet.add_host("h1", rdma=True)
    fleet.add_host("h2", password=PASSWORD)
    fleet.add_host("h3", via="h1", gpus=8)
    fleet.start()
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def demo_ssh(demo: SimFleet, tmp_path_factory: pytest.TempPathFactory) -> FleetSsh:
    return FleetSsh.create(demo.ssh_config_path, tmp_path_factory.mktemp("ssh"), demo.prefix)


def gpu_lines(gpus: list[hardware.FakeGpu]) -> list[str]:
    return [f"{g.index}, {g.uuid}, {g.name}, {g.memory_mib}, {g.bus_id}" for g in gpus]


def assert_no_trace(prefix: str, workdir: Path, users: list[str], uids: set[int]) -> None:
    """Nothing named after the fleet, running from its workdir, owned by its users or mounted from it."""
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith(prefix)]  # fmt: skip
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert prefix not in links
    assert prefix not in subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for database in ("passwd", "group"):
        entries = subprocess.run(["getent", database], capture_output=True, text=True).stdout
        assert not [line for line in entries.splitlines() if line.startswith(prefix)]
    assert not [u for u in users if subprocess.run(["getent", "passwd", u], capture_output=True).returncode == 0]
    assert subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True).returncode == 1
    assert live_processes_of(uids) == []
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert not workdir.exists() or list(workdir.iterdir()) == []


def live_processes_of(uids: set[int]) -> list[str]:
    """Pids running as one of `uids`, not counting zombies (init reaps those in its own time)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if uid in uids and state != "Z":
            found.append(pid)
    return found


# --- start-up and identity -----------------------------------------------------------------------------


@pytest.mark.fleet
def test_eight_hosts_start_and_answer_as_themselves(sim_fleet_factory: Factory, make_ssh: MakeSsh) -> None:
    fleet = sim_fleet_factory()
    for n in range(1, 9):
        fleet.add_host(f"h{n}", gpus=n, image_ref=f"narwhal/engine:v{n}", rdma=n % 2 == 0)
    fleet.start()
    print(f"\n8-host fleet {fleet.prefix} started in {fleet.last_start_seconds:.2f}s")
    ssh = make_ssh(fleet)
    hosts = list(fleet.hosts.values())
    results = ssh.run_all([(h.alias, PROBE.format(image=h.image_ref)) for h in hosts])
    for host, result in zip(hosts, results, strict=True):
        assert result.returncode == 0, result.stderr
        user, hostname, fabric, *rest = result.stdout.splitlines()
        assert (user, hostname) == (host.user, host.name)
        assert f"inet {host.fabric_address}/24" in fabric
        assert rest[: len(host.gpus)] == gpu_lines(host.gpus)
        [image] = json.loads("\n".join(rest[len(host.gpus) :]))
        assert (image["Id"], image["RepoTags"]) == (host.image_id, [host.image_ref])
        assert {ipaddress.ip_address(host.address), ipaddress.ip_address(host.fabric_address)} <= set(FLEET_SPACE)
    assert len({h.image_id for h in hosts}) == 8 and len({g.uuid for h in hosts for g in h.gpus}) == 36
    # Hosts reach each other over the fabric bridge.
    reach = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{hosts[7].fabric_address}/22 && head -c 7 <&3'"
    assert ssh.run("h1", reach).stdout == "SSH-2.0"
    fleet.close()


@pytest.mark.fleet
def test_password_host_takes_the_password_from_a_pipe_only(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    ok = demo_ssh.run_password("h2", "echo $USER", PASSWORD)
    assert (ok.returncode, ok.stdout.strip()) == (0, demo.host("h2").user), ok.stderr
    assert demo_ssh.run_password("h2", "true", "wrong").returncode != 0
    by_key = demo_ssh.run("h2", "true")
    assert by_key.returncode == 255 and "Permission denied" in by_key.stderr


@pytest.mark.fleet
def test_host_behind_bastion_is_reachable_only_through_it(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    h3 = demo.host("h3")
    result = demo_ssh.run("h3", "echo $USER; hostname; ip -o -4 addr show mgmt0")
    assert result.returncode == 0, result.stderr
    user, hostname, mgmt = result.stdout.splitlines()
    assert (user, hostname) == (h3.user, "h3") and f"inet {h3.address}/30" in mgmt
    with socket.socket() as direct, pytest.raises(OSError):
        direct.settimeout(1)
        direct.connect((h3.address, 22))
    assert demo_ssh.run("h3", "true", "-o", "ProxyJump=none", "-o", "ConnectTimeout=2").returncode == 255


@pytest.mark.fleet
def test_a_fleet_past_one_24_reaches_every_host_and_drops_the_rest(tmp_path: Path) -> None:
    """65 hosts: the last one's management /30 lies past the block's first /24, the fabric is a /23."""
    with SimFleet(tmp_path / "fleet", capacity=250) as fleet:
        assert (fleet.net.mgmt.prefixlen, fleet.net.fabric.prefixlen) == (22, 23)
        assert fleet.net.mgmt.subnet_of(FLEET_SPACE) and fleet.net.fabric.subnet_of(FLEET_SPACE)
        hosts = [fleet.add_host(f"h{n}", gpus=1) for n in range(1, 66)]
        assert ipaddress.ip_address(hosts[-1].address) not in next(fleet.net.mgmt.subnets(new_prefix=24))
        fleet.start()
        print(f"\n65-host fleet {fleet.prefix} started in {fleet.last_start_seconds:.2f}s")
        ssh = make_fleet_ssh(fleet, tmp_path)
        results = ssh.run_all([(h.alias, "hostname; ip -o -4 addr show fab0") for h in hosts])
        for host, result in zip(hosts, results, strict=True):
            assert result.returncode == 0, result.stderr
            assert result.stdout.splitlines()[0] == host.name
            assert f"inet {host.fabric_address}/23" in result.stdout
        assert len({h.address for h in hosts} | {h.fabric_address for h in hosts}) == 130
        reach = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{hosts[0].fabric_address}/22 && head -c 7 <&3'"
        assert ssh.run("h65", reach).stdout == "SSH-2.0"
        # An address of the fleet's blocks with no host behind it goes to the sink, not the default route.
        for unused in (fleet.net.mgmt[-6], fleet.net.fabric[-2]):
            route = subprocess.run(["ip", "-4", "route", "get", str(unused)], capture_output=True, text=True).stdout
            assert f"dev {fleet.net.sink} " in route, route
        for n in range(66, 251):
            fleet.net.host_links(n - 1, f"{fleet.prefix}-x{n}", None)
        with pytest.raises(FleetError, match="at most 250 hosts"):
            fleet.net.host_links(250, f"{fleet.prefix}-x251", None)
        users = [h.user for h in hosts]
        uids = {pwd.getpwnam(u).pw_uid for u in users}
    assert_no_trace(fleet.prefix, fleet.workdir, users, uids)


@pytest.mark.fleet
def test_a_relayed_host_answers_after_its_latency_each_way(sim_fleet_factory: Factory, make_ssh: MakeSsh) -> None:
    fleet = sim_fleet_factory()
    slow = fleet.add_host("h1", latency=0.1)
    fleet.add_host("h2")
    fleet.start()
    ssh = make_ssh(fleet)
    result = ssh.run("h1", "echo $USER; hostname")
    assert (result.returncode, result.stdout) == (0, f"{slow.user}\nh1\n"), result.stderr
    # The banner comes after the handshake's 1.5 round trips and one more way; each later exchange, a round trip.
    banner, exchange = banner_and_exchange(slow.address)
    assert banner >= 0.4 and exchange >= 0.2
    fleet.set_latency("h1", 0.25)
    banner, exchange = banner_and_exchange(slow.address)
    assert banner >= 1.0 and exchange >= 0.5
    fleet.set_latency("h1", 0.0)
    with pytest.raises(FleetError, match="no relay"):
        fleet.set_latency("h2", 0.1)
    with pytest.raises(ValueError, match="latency"):
        fleet.set_latency("h1", -1)
    # Stopped, the relay refuses as sshd would; killed, the host takes its relay along; both come back.
    fleet.stop_host("h1")
    refused = ssh.run("h1", "true", "-o", "ConnectTimeout=2")
    assert refused.returncode == 255 and "Connection refused" in refused.stderr
    fleet.start_host("h1")
    fleet.kill_sshd("h1")
    assert "Connection refused" in ssh.run("h1", "true", "-o", "ConnectTimeout=2").stderr
    fleet.start_host("h1")
    assert ssh.run("h1", "hostname").stdout == "h1\n"
    fleet.close()


def banner_and_exchange(address: str) -> tuple[float, float]:
    """Seconds from connect to sshd's banner, and from sending ours to its next bytes (its key exchange)."""
    began = time.monotonic()  # before connecting and before sending: the relay cannot start its clock earlier
    with socket.create_connection((address, 22), timeout=10) as sock:
        assert sock.recv(64).startswith(b"SSH-2.0-")
        banner = time.monotonic() - began
        began = time.monotonic()
        sock.sendall(b"SSH-2.0-fleetsim_test\r\n")
        assert sock.recv(64)
        return banner, time.monotonic() - began


def make_fleet_ssh(fleet: SimFleet, directory: Path) -> FleetSsh:
    return FleetSsh.create(fleet.ssh_config_path, directory, fleet.prefix)


# --- fake hardware -------------------------------------------------------------------------------------


@pytest.mark.fleet
def test_fake_tools_print_the_real_formats(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    h1 = demo.host("h1")
    listed = demo_ssh.run("h1", "nvidia-smi -L")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in h1.gpus]
    bogus = demo_ssh.run("h1", "nvidia-smi --query-gpu=bogus --format=csv")
    assert (bogus.returncode, bogus.stdout.splitlines()[0]) == (2, 'Field "bogus" is not a valid field to query.')
    assert demo_ssh.run("h1", "docker --version").stdout == "Docker version 28.2.2, build e6534b4\n"
    missing = demo_ssh.run("h1", "docker image inspect nope")
    assert (missing.returncode, missing.stdout) == (1, "[]\n")
    assert missing.stderr.strip() == "Error response from daemon: No such image: nope:latest"
    formatted = demo_ssh.run("h1", f"docker image inspect --format '{{{{json .}}}}' {h1.image_ref}")
    image = json.loads(formatted.stdout)
    assert image["Id"] == h1.image_id and image["Architecture"] == "amd64" and image["Created"]
    assert re.fullmatch(r"narwhal/inference-engine@sha256:[0-9a-f]{64}", image["RepoDigests"][0])


@pytest.mark.fleet
def test_docker_run_is_recorded_for_the_calling_user(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    h1 = demo.host("h1")
    run = demo_ssh.run("h1", f"docker run -d --gpus '\"device=0,1\"' {h1.image_ref} serve --port 8000")
    assert run.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", run.stdout)
    record = (h1.home / ".fake-docker-runs.jsonl").read_text().splitlines()[-1]
    assert json.loads(record) == ["run", "-d", "--gpus", '"device=0,1"', h1.image_ref, "serve", "--port", "8000"]
    assert (h1.home / ".fake-docker-runs.jsonl").stat().st_uid == pwd.getpwnam(h1.user).pw_uid


@pytest.mark.fleet
def test_infiniband_sysfs_exists_only_on_rdma_hosts(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    port = "/sys/class/infiniband/mlx5_0/ports/1"
    ib = demo_ssh.run("h1", f"cat {port}/state {port}/link_layer {port}/rate; cat /sys/class/net/fab0/operstate")
    assert ib.stdout.splitlines() == ["4: ACTIVE", "InfiniBand", "400 Gb/sec (4X NDR)", "up"]
    assert demo_ssh.run("h3", "test -e /sys/class/infiniband").returncode == 1
    # Nothing fake shows on the workstation: the binds live in the hosts' private mount namespaces.
    assert str(demo.workdir) not in Path("/proc/self/mountinfo").read_text()


def test_a_terminal_opens_on_every_host_a_grafted_dev_included(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    """sshd allocates a PTY (a role shell needs one) on an RDMA host too, whose /dev is grafted to show
    /dev/infiniband, as on a host without fake devices."""
    for host in ("h1", "h3"):
        done = demo_ssh.run(host, "tty", "-tt")
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.fullmatch(r"/dev/pts/\d+", done.stdout.strip()), done.stdout + done.stderr


@pytest.mark.fleet
def test_models_are_identical_until_one_replica_changes(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    demo.write_model("tiny", {"model.safetensors": bytes(4096)}, {"model_type": "llama"}, hosts=["h1", "h3"])
    digest = "cd /srv/models/tiny && sha256sum config.json model.safetensors"
    first, third = demo_ssh.run("h1", digest).stdout, demo_ssh.run("h3", digest).stdout
    assert first == third and first.count("\n") == 2
    (demo.model_path("h3", "tiny") / "model.safetensors").write_bytes(b"\x01" * 4096)
    assert demo_ssh.run("h3", digest).stdout != first


@pytest.mark.fleet
def test_env_lines_parse_back_with_the_project_env_parser(demo: SimFleet) -> None:
    lines = demo.env_lines({"engine-2": "h2", "router": "h1", "engine-1": "h1", "engine-3": "h3"})
    assert parse_env_text("\n".join(lines) + "\n", "fleet.env") == {
        "NARWHAL_ROUTER_SSH": "h1",
        "NARWHAL_NODE_1_SSH": "h1",
        "NARWHAL_NODE_2_SSH": "h2",
        "NARWHAL_NODE_2_SSH_PASSWORD": PASSWORD,
        "NARWHAL_NODE_3_SSH": "h3",
        "NARWHAL_SSH_CONFIG": str(demo.ssh_config_path),
    }


# --- faults --------------------------------------------------------------------------------------------


@pytest.mark.fleet
def test_rotated_host_key_is_rejected_by_the_recorded_one(sim_fleet_factory: Factory, make_ssh: MakeSsh) -> None:
    fleet = sim_fleet_factory()
    host = fleet.add_host("h1")
    fleet.start()
    ssh = make_ssh(fleet)
    assert ssh.run("h1", "true").returncode == 0
    recorded = ssh.known_hosts.read_text()
    assert any(key.split()[1] in recorded for key in host.host_public_keys())
    before = host.host_key_fingerprints()
    assert all(re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}", fp) for fp in before.values())
    fleet.rotate_host_key("h1")
    after = host.host_key_fingerprints()
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)
    changed = ssh.run("h1", "true")
    assert changed.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    fleet.close()


@pytest.mark.fleet
def test_stopped_sshd_refuses_until_started(demo: SimFleet, demo_ssh: FleetSsh) -> None:
    demo.stop_host("h1")
    try:
        refused = demo_ssh.run("h1", "true", "-o", "ConnectTimeout=2")
        assert refused.returncode == 255 and "Connection refused" in refused.stderr
    finally:
        demo.start_host("h1")
    assert demo_ssh.run("h1", "true").returncode == 0


@pytest.mark.fleet
def test_killed_host_drops_open_sessions(sim_fleet_factory: Factory, make_ssh: MakeSsh) -> None:
    fleet = sim_fleet_factory()
    host = fleet.add_host("h1")
    fleet.start()
    ssh = make_ssh(fleet)
    session = subprocess.Popen([*ssh.argv("h1"), "echo ready; sleep 120"], stdout=subprocess.PIPE, text=True)
    assert session.stdout is not None and session.stdout.readline() == "ready\n"
    fleet.kill_sshd("h1")
    assert session.wait(timeout=10) == 255
    assert "Connection refused" in ssh.run("h1", "true", "-o", "ConnectTimeout=2").stderr
    uid = pwd.getpwnam(host.user).pw_uid
    assert live_processes_of({uid}) == []
    fleet.start_host("h1")
    assert ssh.run("h1", "echo back").stdout == "back\n"
    fleet.close()


@pytest.mark.fleet
@pytest.mark.parametrize("name", ["h1", "h3"])
def test_cut_link_times_out_until_restored(demo: SimFleet, demo_ssh: FleetSsh, name: str) -> None:
    demo.cut_link(name)
    try:
        began = time.monotonic()
        cut = demo_ssh.run(name, "true", "-o", "ConnectTimeout=2")
        assert cut.returncode == 255 and "timed out" in cut.stderr, cut.stderr
        assert time.monotonic() - began >= 1.9
    finally:
        demo.restore_link(name)
    assert demo_ssh.run(name, "true").returncode == 0


# --- removal -------------------------------------------------------------------------------------------


@pytest.mark.fleet
def test_close_removes_everything_it_created(sim_fleet_factory: Factory, make_ssh: MakeSsh) -> None:
    fleet = sim_fleet_factory()
    fleet.add_host("h1", rdma=True)
    fleet.add_host("h2", password="pw")
    fleet.add_host("h3", via="h1")
    fleet.start()
    fleet.write_model("m", {"w.bin": b"x"}, {})
    users = [h.user for h in fleet.hosts.values()]
    uids = {pwd.getpwnam(u).pw_uid for u in users}
    detached = make_ssh(fleet).run("h3", "nohup sleep 300 >/dev/null 2>&1 & echo started")
    assert detached.stdout == "started\n"
    fleet.close()
    fleet.close()
    assert_no_trace(fleet.prefix, fleet.workdir, users, uids)


@pytest.mark.fleet
def test_demo_cli_leaves_a_running_fleet_that_stop_removes(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    cli = [sys.executable, "-m", "fleetsim"]
    started = subprocess.run([*cli, "start", "--dir", str(directory)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    state: dict[str, Any] = json.loads((directory / "fleet.json").read_text())
    uids = {pwd.getpwnam(u).pw_uid for u in state["users"]}
    try:
        env = parse_env_text(started.stdout, "demo.env")
        assert {k: v for k, v in env.items() if not k.endswith("PASSWORD")} == {
            "NARWHAL_ROUTER_SSH": "h1", "NARWHAL_NODE_1_SSH": "h1", "NARWHAL_NODE_2_SSH": "h2",
            "NARWHAL_NODE_3_SSH": "h3", "NARWHAL_SSH_CONFIG": str(directory / "ssh_config"),
        }  # fmt: skip
        ssh = FleetSsh.create(directory / "ssh_config", tmp_path)
        assert ssh.run("h3", "hostname; ls /srv/models").stdout == "h3\ndemo-model\n"
        password = ssh.run_password("h2", "hostname", env["NARWHAL_NODE_2_SSH_PASSWORD"])
        assert password.stdout == "h2\n", password.stderr
    finally:
        stopped = subprocess.run([*cli, "stop", "--dir", str(directory)], capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    assert_no_trace(state["prefix"], directory, state["users"], uids)
    assert not directory.exists()


@pytest.mark.fleet
def test_a_host_that_cannot_boot_fails_start_with_its_log_and_leaves_nothing(
    sim_fleet_factory: Factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "host-init.sh"
    broken.write_text("echo 'sshd: no hostkeys available -- exiting.' >&2; exit 1\n")
    monkeypatch.setattr(fleet_module, "INIT_SCRIPT", broken)
    fleet = sim_fleet_factory()
    users = [fleet.add_host(name).user for name in ("h1", "h2")]
    with pytest.raises(FleetError, match="no hostkeys available"):
        fleet.start()
    assert_no_trace(fleet.prefix, fleet.workdir, users, set())


def test_stop_refuses_a_state_file_naming_foreign_resources(tmp_path: Path) -> None:
    state = FleetState(prefix="nwdead", workdir=str(tmp_path), users=["root"], netns=["other"], paths=["../x"])
    state.save()
    with pytest.raises(FleetError, match=r"user 'root'.*netns 'other'|netns 'other'.*user 'root'"):
        FleetState.load(tmp_path)


# --- the address plan without a fleet -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "prefixes"),
    [(1, (24, 24)), (60, (24, 24)), (63, (24, 24)), (64, (23, 24)), (245, (22, 24)), (246, (22, 23)),
     (250, (22, 23)), (1000, (20, 22))],
)  # fmt: skip
def test_blocks_are_sized_for_the_fleet(capacity: int, prefixes: tuple[int, int]) -> None:
    assert network.plan_prefixes(capacity) == prefixes


def test_every_host_of_the_largest_fleet_has_its_own_addresses_and_short_names() -> None:
    mgmt, fabric = (ipaddress.ip_network(n) for n in ("198.18.16.0/20", "198.19.0.0/22"))
    net = network.FleetNetwork("nwabcdef", mgmt, fabric, network.MAX_HOSTS)
    links = [net.host_links(i, f"nwabcdef-h{i}", None) for i in range(network.MAX_HOSTS)]
    blocks = {ipaddress.ip_network(link.host_ip, strict=False) for link in links}
    assert len(blocks) == network.MAX_HOSTS and all(b.prefixlen == 30 and b.subnet_of(mgmt) for b in blocks)
    assert all(link.near_ip.network == link.host_ip.network for link in links)
    gateway = ipaddress.ip_network(f"{mgmt[-2]}/30", strict=False)
    assert gateway not in blocks
    fabric_ips = {link.fabric_ip.ip for link in links}
    assert len(fabric_ips) == network.MAX_HOSTS and max(fabric_ips) < fabric.broadcast_address
    assert all(link.fabric_ip.network == fabric for link in links)
    assert max(len(name) for link in links for name in (link.mgmt_link, link.fabric_link)) <= 15
    for too_many in (0, network.MAX_HOSTS + 1):
        with pytest.raises(FleetError, match="1 to 1000 hosts"):
            network.plan_prefixes(too_many)
    with pytest.raises(FleetError, match="cannot hold"):
        network.FleetNetwork("nwabcdef", ipaddress.ip_network("198.18.0.0/24"), fabric, 64)


def test_blocks_are_picked_aligned_and_apart_from_what_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only 198.18.4.0/22 and 198.18.9.0/24 are free: the /22 goes to management, the /24 to the fabric."""
    used = [n for n in FLEET_SPACE.subnets(new_prefix=24) if not (n.subnet_of(ipaddress.ip_network("198.18.4.0/22"))
                                                                  or str(n) == "198.18.9.0/24")]  # fmt: skip
    monkeypatch.setattr(network, "used_networks", lambda: list(used))
    assert [str(n) for n in network.pick_networks([22, 24])] == ["198.18.4.0/22", "198.18.9.0/24"]
    with pytest.raises(FleetError, match="no unused /23"):
        network.pick_networks([22, 23])


# --- fake tool formats without a fleet -----------------------------------------------------------------


def test_nvidia_smi_csv_header_units_and_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = hardware.make_gpus("hx", 2, "NVIDIA H200", 143771)
    monkeypatch.setattr(fake_nvidia_smi, "CONFIG", {"gpus": [g._asdict() for g in gpus], "driver_version": "1"})
    status, out = fake_nvidia_smi.main(["--query-gpu=index,memory.total,gpu_bus_id", "--format=csv"])
    assert status == 0
    assert out.splitlines() == ["index, memory.total [MiB], gpu_bus_id", "0, 143771 MiB, 00000000:19:00.0",
                                "1, 143771 MiB, 00000000:3B:00.0"]  # fmt: skip
    assert fake_nvidia_smi.main(["--query-gpu", "count", "--format", "csv,noheader"]) == (0, "2\n2\n")


def test_nvidia_smi_matches_the_real_h200_capture_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    capture = Path(__file__).parents[1] / "fixtures" / "h200-capture"
    gpu = hardware.FakeGpu(0, "GPU-47e4f408-caf2-4eaa-9629-5a6d1365dd75", "NVIDIA H200", 143771, "00000000:00:06.0")
    config = {"gpus": [gpu._asdict()], "driver_version": hardware.DRIVER_VERSION, "cuda_version": hardware.CUDA_VERSION}
    monkeypatch.setattr(fake_nvidia_smi, "CONFIG", config)
    fields = "--query-gpu=index,uuid,name,memory.total,pci.bus_id"
    cases = {
        "nvidia-smi-query.csv": (0, [fields, "--format=csv,noheader,nounits"]),
        "nvidia-smi-query-header.csv": (0, [fields, "--format=csv"]),
        "nvidia-smi-L.txt": (0, ["-L"]),
        "nvidia-smi-bad.txt": (2, ["--query-gpu=bogus.field", "--format=csv,noheader"]),
        "nvidia-smi-version.txt": (0, ["--version"]),
    }
    for name, (status, argv) in cases.items():
        assert fake_nvidia_smi.main(argv) == (status, (capture / name).read_text()), name


def test_docker_inspect_lookup_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    image = hardware.image_inspect_object(hardware.default_image_id("reg/app:1"), "reg/app:1")
    monkeypatch.setattr(fake_docker, "CONFIG", hardware.docker_config([image]))
    digest_ref = image["RepoDigests"][0]
    for ref in (image["Id"], image["Id"][7:19], "reg/app:1", digest_ref):
        status, out, err = fake_docker.main(["image", "inspect", "-f", "{{.Id}}", ref])
        assert (status, out, err) == (0, image["Id"] + "\n", "")
    status, out, err = fake_docker.main(["image", "inspect", "reg/app"])
    assert (status, out, err) == (1, "[]\n", "Error response from daemon: No such image: reg/app:latest\n")
    status, out, _ = fake_docker.main(["image", "inspect", "reg/app:1", image["Id"]])
    assert (status, out) == (0, json.dumps([image, image], indent=4) + "\n")


def test_rendered_tools_run_under_the_system_python(tmp_path: Path) -> None:
    gpus = hardware.make_gpus("hx", 1, "NVIDIA H200", 143771)
    hardware.write_tools(tmp_path, gpus, [hardware.image_inspect_object("sha256:" + "a" * 64, "x/y:z")])
    query = QUERY.split()[1:]
    out = subprocess.run([str(tmp_path / "nvidia-smi"), *query], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == gpu_lines(gpus)
    out = subprocess.run([str(tmp_path / "docker"), "inspect", "-f", "{{.Id}}", "x/y:z"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out == "sha256:" + "a" * 64 + "\n"

"""A simulated GPU fleet on one machine: each host is a network namespace running a real OpenSSH server.

Tests and the README demo need hosts that behave like the real ones where it matters to the deployer:
their own addresses, host keys, Unix account and home, ProxyJump-only hosts, sshd that can be stopped,
killed, re-keyed or cut off. Only hardware that cannot exist here (GPUs, Docker images, InfiniBand,
model files) is faked, and only on the host side, by bind mounts in each sshd's private mount
namespace (see host-init.sh). Everything created is recorded in `<workdir>/fleet.json` and removed by
`close()` (also at interpreter exit) or by `python -m fleetsim stop`.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from fleetsim import hardware, network, system
from fleetsim.hardware import FakeGpu
from fleetsim.network import FleetNetwork, HostLinks
from fleetsim.state import PREFIX_RE, USER_COMMENT, FleetState, teardown
from fleetsim.system import FleetError

HOST_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,14}")
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ENGINE_ROLE_RE = re.compile(r"engine-([1-9][0-9]*)")
HOST_KEY_TYPES = ("ed25519", "ecdsa")
SSH_PORT = 22
TRUSTED_USER_CA = "trusted_user_ca.pub"
INIT_SCRIPT = Path(__file__).with_name("host-init.sh")
RELAY_SCRIPT = Path(__file__).with_name("relay.py")
LATENCY_FILE = "latency"
MAX_LATENCY = 5.0  # one-way seconds: more than any region or bastion a fleet sits behind
KEYGEN_PARALLEL = max(2, os.cpu_count() or 1)
BOOT_PARALLEL = 32  # hosts booting (host-init.sh, then sshd) at once
_ENV_PLAIN = re.compile(r"[A-Za-z0-9_./:@%+=,-]*")


@dataclass
class SimHost:
    """One simulated physical host, as the workstation sees it (paths are workstation-side)."""

    name: str
    user: str
    address: str
    port: int
    fabric_address: str
    netns: str
    home: Path  # workstation-side path of the host user's home (see remote_home)
    password: str | None = field(repr=False)
    via: str | None
    gpus: list[FakeGpu]
    image_id: str
    image_ref: str
    rdma: bool
    hostdir: Path
    authorize_client_key: bool
    links: HostLinks = field(repr=False)
    trusted_user_ca: str | None = None  # a CA public key line: sshd accepts user certificates it signed
    latency: float | None = None  # one-way seconds added by the host's relay (relay.py); None: no relay

    @property
    def alias(self) -> str:
        """The `Host` alias in the fleet's ssh config."""
        return self.name

    @property
    def remote_home(self) -> str:
        """The home as the host sees it; `home` is the same directory seen from the workstation.

        Each host's mount namespace shows only its own account's home under /home, so the workdir's
        location and permissions never matter to the host's user.
        """
        return f"/home/{self.user}"

    @property
    def keys_dir(self) -> Path:
        return self.hostdir / "etc"

    def host_public_keys(self) -> list[str]:
        """The `.pub` lines of the host keys sshd currently serves (what a known_hosts entry pins)."""
        return [self._pub(kind).read_text(encoding="ascii").strip() for kind in HOST_KEY_TYPES]

    def host_key_fingerprints(self) -> dict[str, str]:
        """Key type (`ssh-ed25519`, ...) -> `SHA256:...`, computed by `ssh-keygen -lf` as an operator would."""
        result = {}
        for kind in HOST_KEY_TYPES:
            pub = self._pub(kind)
            key_type = pub.read_text(encoding="ascii").split()[0]
            result[key_type] = system.run(["ssh-keygen", "-lf", str(pub)]).stdout.split()[1]
        return result

    def _pub(self, kind: str) -> Path:
        return self.keys_dir / f"ssh_host_{kind}_key.pub"


class SimFleet:
    """Simulated hosts sharing one workdir, one address plan, one client key and one ssh config.

    Names of namespaces, links and users carry a random prefix, so fleets of parallel test runs never
    collide. Subnets are claimed at construction (so host addresses are known before `start()`), sized for
    `capacity` hosts (network.plan_prefixes; at most network.MAX_HOSTS).
    """

    def __init__(self, workdir: Path, *, prefix: str | None = None, capacity: int = network.DEFAULT_CAPACITY) -> None:
        network.plan_prefixes(capacity)  # a capacity out of range fails before anything is created
        missing = system.missing_prerequisites()
        if missing:
            raise FleetError("cannot simulate hosts here, missing: " + "; ".join(missing))
        self.workdir = Path(workdir).absolute()
        created = not self.workdir.exists()
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_fresh_workdir(self.workdir)
        self.prefix = _claim_prefix(prefix)
        self.hosts: dict[str, SimHost] = {}
        self.last_start_seconds: float | None = None
        self._state = FleetState(prefix=self.prefix, workdir=str(self.workdir), created_workdir=created)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}  # host name -> its sshd
        self._relays: dict[str, subprocess.Popen[bytes]] = {}  # host name -> its relay (hosts with a latency)
        self._retired: list[subprocess.Popen[bytes]] = []  # stopped relays finishing their connections
        self._lock = threading.RLock()
        self._started = self._closed = self._detached = False
        atexit.register(self.close)
        try:
            self.net = self._create_base(capacity)
        except BaseException:
            self.close()
            raise

    # --- paths -------------------------------------------------------------------------------------

    @property
    def ssh_config_path(self) -> Path:
        """OpenSSH client config with one `Host` alias per simulated host."""
        return self.workdir / "ssh_config"

    @property
    def client_key_path(self) -> Path:
        """The fleet's ed25519 client key (0600), authorised on every key-auth host."""
        return self.workdir / "client" / "id_ed25519"

    @property
    def state_path(self) -> Path:
        return self._state.path

    # --- building ----------------------------------------------------------------------------------

    def add_host(
        self,
        name: str,
        *,
        password: str | None = None,
        gpus: int = 2,
        gpu_name: str = hardware.DEFAULT_GPU_NAME,
        gpu_memory_mib: int = hardware.DEFAULT_GPU_MEMORY_MIB,
        image_id: str | None = None,
        image_ref: str = hardware.DEFAULT_IMAGE_REF,
        rdma: bool = False,
        via: str | None = None,
        authorize_client_key: bool | None = None,
        trusted_user_ca: str | None = None,
        latency: float | None = None,
    ) -> SimHost:
        """Describe a host; it comes up with `start()` (or at once if the fleet is already running).

        A password host gets `PasswordAuthentication yes` and, unless `authorize_client_key=True`, no
        authorised key, so a test cannot pass by key when it meant to use the password. A `via` host
        has no link to the root namespace: only its bastion can reach it (ProxyJump). `trusted_user_ca`
        (a public key line) makes sshd accept user certificates that CA signed (`TrustedUserCAKeys`). With
        `latency` (one-way seconds, 0 allowed) the host's management address is served by a relay that delays
        every byte that much each way (relay.py; `set_latency` changes it later); without it, by sshd itself.
        """
        with self._lock:
            self._check_new_host(name, via, image_id)
            _check_latency(latency)
            netns = f"{self.prefix}-{name}"
            near = self.hosts[via].netns if via else None
            links = self.net.host_links(len(self.hosts), netns, near)
            host = SimHost(
                name=name,
                user=f"{self.prefix}{name}",
                address=str(links.host_ip.ip),
                port=SSH_PORT,
                fabric_address=str(links.fabric_ip.ip),
                netns=netns,
                home=self.workdir / "homes" / name,
                password=password,
                via=via,
                gpus=hardware.make_gpus(name, gpus, gpu_name, gpu_memory_mib),
                image_id=image_id or hardware.default_image_id(image_ref),
                image_ref=image_ref,
                rdma=rdma,
                hostdir=self.workdir / "hosts" / name,
                authorize_client_key=password is None if authorize_client_key is None else authorize_client_key,
                links=links,
                trusted_user_ca=trusted_user_ca,
                latency=latency,
            )
            self.hosts[name] = host
            if self._started:
                self._bring_up([host])
            return host

    def start(self) -> None:
        """Bring every added host up; returns once each sshd answers (SSH banner) inside its namespace."""
        with self._lock:
            self._check_open()
            began = time.monotonic()
            try:
                self._bring_up([h for h in self.hosts.values() if h.name not in self._procs])
            except BaseException:
                self.close()
                raise
            self._started = True
            self.last_start_seconds = time.monotonic() - began

    # --- operations on a running fleet -------------------------------------------------------------

    def stop_host(self, name: str) -> None:
        """SIGTERM the sshd listener (new connections are refused); open sessions live on, as with
        `systemctl stop ssh` on Debian. A host's relay stops listening too, and ends with its last connection."""
        with self._lock:
            proc = self._procs.pop(self.host(name).name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
            relay = self._relays.pop(name, None)
            if relay is not None:
                relay.terminate()
                self._retired.append(relay)

    def start_host(self, name: str) -> None:
        """Start a stopped or killed host's sshd (and relay) again and wait until it answers."""
        with self._lock:
            host = self.host(name)
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                self._launch(host)
                self._wait_ready(host)

    def kill_sshd(self, name: str) -> None:
        """SIGKILL the listener, every session and every process the host's user runs: the host dies."""
        with self._lock:
            host = self.host(name)
            inode = system.netns_inode(host.netns)
            system.kill_host_processes({inode} if inode else set(), {pwd.getpwnam(host.user).pw_uid})
            for procs in (self._procs, self._relays):
                proc = procs.pop(name, None)
                if proc is not None:
                    proc.wait(timeout=10)

    def set_latency(self, name: str, seconds: float) -> None:
        """Change a relayed host's one-way latency for the connections opened from now on."""
        with self._lock:
            host = self.host(name)
            if host.latency is None:
                raise FleetError(f"host {name!r} has no relay: add it with latency=0.0 to change its latency later")
            _check_latency(seconds)
            host.latency = seconds
            _write_latency(host)
            if name in self._state.hosts:
                self._state.hosts[name]["latency"] = seconds
                self._state.save()

    def rotate_host_key(self, name: str) -> None:
        """Replace all host keys and restart sshd, as a reinstalled machine would present itself."""
        with self._lock:
            host = self.host(name)
            running = name in self._procs
            for kind in HOST_KEY_TYPES:
                for suffix in ("", ".pub"):
                    (host.keys_dir / f"ssh_host_{kind}_key{suffix}").unlink(missing_ok=True)
            _generate_host_keys(host)
            if running:
                self.stop_host(name)
                self.start_host(name)

    def cut_link(self, name: str) -> None:
        """Take the host's management link down: packets to it vanish, so connections time out."""
        network.set_host_link(self.host(name).netns, up=False)

    def restore_link(self, name: str) -> None:
        network.set_host_link(self.host(name).netns, up=True)

    # --- models ------------------------------------------------------------------------------------

    def write_model(
        self, name: str, files: dict[str, bytes], config: dict[str, Any], hosts: list[str] | None = None
    ) -> dict[str, Path]:
        """Write the same model (config.json + files) on each host, seen there as /srv/models/<name>.

        Returns host name -> workstation-side directory.
        """
        if not MODEL_NAME_RE.fullmatch(name):
            raise ValueError(f"model name {name!r}: use letters, digits, '.', '_' and '-'")
        written = {}
        for host_name in hosts if hosts is not None else list(self.hosts):
            path = self.model_path(host_name, name)
            hardware.write_model(path, files, config)
            written[host_name] = path
        return written

    def model_path(self, host: str | SimHost, name: str) -> Path:
        """Workstation-side directory of a host's model replica (edit it to make one replica differ)."""
        host_name = host.name if isinstance(host, SimHost) else host
        return self.host(host_name).hostdir / "models" / name

    # --- client side -------------------------------------------------------------------------------

    def host(self, name: str) -> SimHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise FleetError(f"no simulated host {name!r} (have: {', '.join(self.hosts)})") from None

    def env_lines(self, roles: dict[str, str]) -> list[str]:
        """`.env` lines for role -> host name: `NARWHAL_ROUTER_SSH` / `NARWHAL_NODE_<n>_SSH` (+ `_PASSWORD`
        for password hosts) and `NARWHAL_SSH_CONFIG`."""
        lines = []
        for role, host_name in sorted(roles.items(), key=lambda item: _role_order(item[0])):
            host = self.host(host_name)
            variable = _role_variable(role)
            lines.append(f"{variable}={_env_quote(host.alias)}")
            if host.password is not None:
                lines.append(f"{variable}_PASSWORD={_env_quote(host.password)}")
        lines.append(f"NARWHAL_SSH_CONFIG={_env_quote(str(self.ssh_config_path))}")
        return lines

    # --- teardown ----------------------------------------------------------------------------------

    def detach(self) -> None:
        """Leave the fleet running after this process exits (the demo's `start`); `stop` removes it."""
        with self._lock:
            self._detached = True
            atexit.unregister(self.close)

    def close(self) -> None:
        """Remove everything this fleet created. Safe to call twice; a detached fleet is left running."""
        with self._lock:
            if self._closed or self._detached:
                return
            self._closed = True
            atexit.unregister(self.close)
            problems = teardown(self._state)
            for proc in [*self._procs.values(), *self._relays.values(), *self._retired]:
                proc.wait(timeout=10)
            self._procs.clear()
            self._relays.clear()
            self._retired.clear()
            if problems:
                raise FleetError(f"fleet {self.prefix}: teardown problems: {'; '.join(problems)}")

    def __enter__(self) -> SimFleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------------------

    def _record(self, kind: str, name: str) -> None:
        """Note a resource in the state file *before* creating it, so a crash midway is still cleaned."""
        getattr(self._state, kind).append(name)
        self._state.save()

    def _create_base(self, capacity: int) -> FleetNetwork:
        for rel, mode in (("hosts", 0o700), ("homes", 0o700), ("client", 0o700)):
            self._record("paths", rel)
            (self.workdir / rel).mkdir(mode=mode)
        self._record("paths", "ssh_config")
        system.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fleetsim-{self.prefix}",
                    "-f", str(self.client_key_path)])  # fmt: skip
        with system.network_claim_lock():
            mgmt, fabric = network.pick_networks(list(network.plan_prefixes(capacity)))
            net = FleetNetwork(self.prefix, mgmt, fabric, capacity)
            self._record("links", net.sink)
            self._record("links", net.bridge)
            net.create_fleet_links()
        net.check_unshared()
        return net

    def _check_open(self) -> None:
        if self._closed or self._detached:
            raise FleetError(f"fleet {self.prefix} is closed")

    def _check_new_host(self, name: str, via: str | None, image_id: str | None) -> None:
        self._check_open()
        if not HOST_NAME_RE.fullmatch(name):
            raise ValueError(f"host name {name!r}: lowercase letter first, then [a-z0-9-], at most 15")
        if name in self.hosts:
            raise ValueError(f"host {name!r} already exists")
        if via is not None and via not in self.hosts:
            raise ValueError(f"bastion {via!r} must be added before the hosts behind it")
        if image_id is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", image_id):
            raise ValueError(f"image_id {image_id!r} is not sha256:<64 hex>")

    def _bring_up(self, hosts: list[SimHost]) -> None:
        """Bring `hosts` up together: their host keys are generated meanwhile (a few ssh-keygen at a time),
        every resource is recorded in one save before any is made, and accounts, links and sshd go in batches,
        so a large fleet costs a few processes per host and its start time grows linearly."""
        for host in hosts:
            host.keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=KEYGEN_PARALLEL, thread_name_prefix="fleetsim-keygen") as pool:
            keys = [pool.submit(_generate_host_keys, host) for host in hosts]
            self._record_hosts(hosts)
            for host in hosts:
                _write_host_files(host)
            small = self.net.capacity <= network.DEFAULT_CAPACITY
            accounts = [system.add_user(host.user, Path(host.remote_home), f"{USER_COMMENT} {self.prefix} {host.name}",
                                        system=small) for host in hosts]  # fmt: skip
            system.set_passwords({host.user: host.password for host in hosts})
            key = self.client_key_path.with_suffix(".pub").read_text(encoding="ascii")
            for host, account in zip(hosts, accounts, strict=True):
                _make_home(host.home, account, key if host.authorize_client_key else "")
            network.create_host_links([host.links for host in hosts], self.net.bridge)
            for host in hosts:
                self._state.hosts[host.name] = {"user": host.user, "address": host.address, "netns": host.netns,
                                                "via": host.via, "fabric_address": host.fabric_address}  # fmt: skip
            for job in keys:
                job.result()
        self._write_ssh_config()
        booting: deque[SimHost] = deque()
        for host in hosts:  # at most BOOT_PARALLEL at once, so each host's deadline measures its own boot
            if len(booting) >= BOOT_PARALLEL:
                self._wait_ready(booting.popleft())
            self._launch(host)
            booting.append(host)
        for host in booting:
            self._wait_ready(host)
        self._state.save()

    def _record_hosts(self, hosts: list[SimHost]) -> None:
        """Note every account, namespace and root-namespace link of `hosts` in one save, before any is made
        (teardown passes over what never came to exist)."""
        for host in hosts:
            self._state.users.append(host.user)
            self._state.netns.append(host.netns)
            if host.links.near_netns is None:
                self._state.links.append(host.links.mgmt_link)
            self._state.links.append(host.links.fabric_link)
        self._state.save()

    def _launch(self, host: SimHost) -> None:
        """Start sshd in the host's network namespace, under a fresh mount+UTS namespace (host-init.sh), and
        the host's relay unless it has none or its relay still runs.

        A relayed host's sshd listens on loopback and the fabric address; the relay takes the management
        address. A new session keeps both alive when a detached demo's `start` command exits.
        """
        listen = (
            []
            if host.latency is None
            else ["-o", "ListenAddress=127.0.0.1", "-o", f"ListenAddress={host.fabric_address}"]
        )
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "--propagation", "slave",
                "--", "/bin/sh", str(INIT_SCRIPT), host.name, str(host.hostdir),
                str(host.keys_dir / "sshd_config"), str(host.home), host.remote_home, *listen]  # fmt: skip
        self._procs[host.name] = _spawn(argv, host.hostdir / "sshd.log")
        self._state.hosts[host.name]["pid"] = self._procs[host.name].pid
        relay = self._relays.get(host.name)
        if host.latency is not None and (relay is None or relay.poll() is not None):
            _write_latency(host)
            argv = ["ip", "netns", "exec", host.netns, sys.executable, "-I", "-S", str(RELAY_SCRIPT), host.address,
                    str(host.port), "127.0.0.1", str(host.port), str(host.hostdir / LATENCY_FILE)]  # fmt: skip
            self._relays[host.name] = _spawn(argv, host.hostdir / "relay.log")
            self._state.hosts[host.name]["latency"] = host.latency

    def _wait_ready(self, host: SimHost) -> None:
        proc = self._procs[host.name]
        sshd = host.address if host.latency is None else "127.0.0.1"
        try:
            system.wait_for_sshd(host.netns, sshd, host.port, alive=lambda: proc.poll() is None)
            if host.latency is not None:
                relay = self._relays[host.name]
                system.wait_for_listener(host.netns, host.address, host.port, alive=lambda: relay.poll() is None)
        except FleetError as exc:
            logs = [host.hostdir / name for name in ("sshd.log", "relay.log")]
            tails = "".join(f"; {log.name}:\n{log.read_text(encoding='utf-8', errors='replace')[-2000:]}"
                            for log in logs if log.exists())  # fmt: skip
            raise FleetError(f"{exc}{tails}") from None

    def _write_ssh_config(self) -> None:
        blocks = [f"# narwhal fleetsim {self.prefix}: aliases of the simulated hosts (removed with the fleet)\n"]
        for host in self.hosts.values():
            lines = [f"Host {host.alias}", f"HostName {host.address}", f"User {host.user}", f"Port {host.port}",
                     f"IdentityFile {_ssh_quote(str(self.client_key_path))}", "IdentitiesOnly yes"]  # fmt: skip
            if host.via:
                lines.append(f"ProxyJump {self.hosts[host.via].alias}")
            blocks.append(lines[0] + "\n" + "".join(f"    {line}\n" for line in lines[1:]))
        self.ssh_config_path.write_text("\n".join(blocks), encoding="utf-8")
        self.ssh_config_path.chmod(0o600)


# --- module helpers ------------------------------------------------------------------------------------


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _check_latency(seconds: float | None) -> None:
    if seconds is not None and not 0 <= seconds <= MAX_LATENCY:
        raise ValueError(f"latency {seconds!r}: one-way seconds from 0 to {MAX_LATENCY}")


def _write_latency(host: SimHost) -> None:
    """The one-way latency the host's relay reads at each new connection (written whole, then renamed in)."""
    path = host.hostdir / LATENCY_FILE
    part = path.with_name(f".{LATENCY_FILE}.part")
    part.write_text(f"{host.latency}\n", encoding="ascii")
    os.replace(part, path)


def _check_fresh_workdir(workdir: Path) -> None:
    if (workdir / "fleet.json").exists():
        raise FleetError(f"{workdir} already holds a fleet (fleet.json); stop it first")


def _claim_prefix(requested: str | None) -> str:
    """A prefix no existing namespace, link or account uses (random unless one is requested)."""
    for _ in range(50):
        prefix = requested or f"nw{secrets.token_hex(2)}"
        if not PREFIX_RE.fullmatch(prefix):
            raise ValueError(f"prefix {prefix!r}: a lowercase letter then 1-7 of [a-z0-9]")
        if not _prefix_in_use(prefix):
            return prefix
        if requested:
            raise FleetError(f"prefix {prefix!r} is already in use on this machine")
    raise FleetError("could not find an unused fleet prefix")


def _prefix_in_use(prefix: str) -> bool:
    netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    links = [line.split(":")[1].strip().split("@")[0] for line in
             system.run(["ip", "-o", "link", "show"]).stdout.splitlines()]  # fmt: skip
    users = [entry.pw_name for entry in pwd.getpwall()]
    return any(name.startswith(prefix) for name in [*netns, *links, *users])


def _generate_host_keys(host: SimHost) -> None:
    """ssh-keygen for every missing host key of `host` (its keys directory exists)."""
    for kind in HOST_KEY_TYPES:
        key = host.keys_dir / f"ssh_host_{kind}_key"
        if not key.exists():
            system.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"root@{host.name}", "-f", str(key)])


def _write_host_files(host: SimHost) -> None:
    """Fake tools, model store, InfiniBand sysfs tree, privsep dir and sshd_config of one host."""
    for sub, mode in (("bin", 0o755), ("models", 0o755), ("privsep", 0o755), ("stash", 0o700)):
        (host.hostdir / sub).mkdir(mode=mode, exist_ok=True)
        (host.hostdir / sub).chmod(mode)
    images = [hardware.image_inspect_object(host.image_id, host.image_ref)]
    hardware.write_tools(host.hostdir / "bin", host.gpus, images)
    if host.rdma:
        hardware.write_infiniband(host.hostdir / "infiniband")
        hardware.write_rdma_devices(host.hostdir / "dev-infiniband")
    if host.trusted_user_ca is not None:
        (host.keys_dir / TRUSTED_USER_CA).write_text(host.trusted_user_ca.strip() + "\n", encoding="ascii")
    config = host.keys_dir / "sshd_config"
    config.write_text(_sshd_config(host), encoding="utf-8")
    config.chmod(0o600)


def _sshd_config(host: SimHost) -> str:
    """One host's sshd_config: only its user, keys or (password hosts) passwords, forwarding for ProxyJump."""
    lines = [
        f"# narwhal fleetsim host {host.name} (generated; removed with the fleet)",
        f"Port {host.port}",
        "AddressFamily inet",
        *(f"HostKey {_ssh_quote(str(host.keys_dir / f'ssh_host_{kind}_key'))}" for kind in HOST_KEY_TYPES),
        f"PidFile {_ssh_quote(str(host.hostdir / 'sshd.pid'))}",
        "UsePAM no",
        "PermitRootLogin no",
        f"AllowUsers {host.user}",
        f"AuthorizedKeysFile {host.remote_home}/.ssh/authorized_keys",
        "PubkeyAuthentication yes",
        f"PasswordAuthentication {'yes' if host.password is not None else 'no'}",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "StrictModes yes",
        "AllowTcpForwarding yes",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PermitUserEnvironment no",
        "PrintMotd no",
        "UseDNS no",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
    ]
    if host.trusted_user_ca is not None:
        lines.append(f"TrustedUserCAKeys {_ssh_quote(str(host.keys_dir / TRUSTED_USER_CA))}")
    return "\n".join(lines) + "\n"


def _make_home(home: Path, account: pwd.struct_passwd, authorized_key: str) -> None:
    """Home 0700, ~/.ssh 0700, authorized_keys 0600, all owned by the host's user (StrictModes)."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, mode=0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(authorized_key, encoding="ascii")
    for path, mode in ((home, 0o700), (ssh_dir, 0o700), (keys, 0o600)):
        os.chown(path, account.pw_uid, account.pw_gid)
        path.chmod(mode)


def _role_order(role: str) -> tuple[int, int]:
    match = ENGINE_ROLE_RE.fullmatch(role)
    return (0, 0) if role == "router" else (1, int(match.group(1)) if match else 0)


def _role_variable(role: str) -> str:
    if role == "router":
        return "NARWHAL_ROUTER_SSH"
    match = ENGINE_ROLE_RE.fullmatch(role)
    if match is None:
        raise ValueError(f"role {role!r}: expected 'router' or 'engine-<n>'")
    return f"NARWHAL_NODE_{match.group(1)}_SSH"


def _env_quote(value: str) -> str:
    """Plain when bash keeps it literally, else single-quoted (the project's envfile reads both)."""
    return value if value and _ENV_PLAIN.fullmatch(value) else "'" + value.replace("'", "'\\''") + "'"


def _ssh_quote(value: str) -> str:
    """OpenSSH config files split on whitespace; double quotes keep a path with spaces whole."""
    if '"' in value:
        raise FleetError(f"path {value!r} contains a double quote, which ssh config files cannot hold")
    return f'"{value}"' if any(c.isspace() for c in value) else value

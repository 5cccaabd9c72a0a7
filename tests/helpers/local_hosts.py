"""Fleet hosts without sshd or root: each host a HOME directory on this machine where the REAL host programs
(installer, lease) run, fed on stdin exactly as over SSH. A `LocalConnector` stands where `ssh.transport.Connector`
does, so the fleet operation (`workflows.rollout`: leases, stage, activate, canary, failure ordering) runs in
the unit tier. It counts what a transport would: connections open at once, and the order hosts were first
contacted."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.host_program import run_host_program
from helpers.installer_host import make_source
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import DeploymentManifest, ManifestHost, PreparedFile, PreparedRun
from narwhal_assets.ssh.transport import CommandResult, HostAccess

DEPLOYMENT = "0123456789abcdef0123456789abcdef"
FINGERPRINT = "SHA256:" + "A" * 43
FAIL_FLAG = "fail-check"  # a host whose HOME holds it fails its check command
CHECK = f'test ! -e "$HOME/{FAIL_FLAG}"'


class _Transport:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


@dataclass
class LocalConnection:
    host_id: str
    home: Path
    connector: LocalConnector
    transport: _Transport = field(default_factory=_Transport)

    def run_program(self, name: str, stream: bytes, timeout: float | None = None) -> CommandResult:
        began = time.monotonic()
        env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        done = run_host_program(stream, env, timeout or 120)
        return CommandResult(done.returncode, done.stdout, done.stderr, time.monotonic() - began)

    def close(self) -> None:
        if self.transport.active:
            self.transport.active = False
            self.connector.closed(self)


@dataclass
class LocalConnector:
    homes: dict[str, Path]
    contacted: list[str] = field(default_factory=list)  # host ids, in the order of their first connection
    open_now: int = 0
    peak: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def connect(self, access: HostAccess, deadline: float | None = None) -> LocalConnection:
        with self._lock:
            if access.host_id not in self.contacted:
                self.contacted.append(access.host_id)
            self.open_now += 1
            self.peak = max(self.peak, self.open_now)
        return LocalConnection(access.host_id, self.homes[access.host_id], self)

    def closed(self, connection: LocalConnection) -> None:
        with self._lock:
            self.open_now -= 1


@dataclass
class LocalFleet:
    """`count` hosts node-1..node-N (one engine each), their checkout settings and one prepared run."""

    root: Path
    entries: list[HostEntry]
    settings: Settings
    run: PreparedRun
    connector: LocalConnector

    def home(self, host_id: str) -> Path:
        return self.connector.homes[host_id]

    def current(self, host_id: str) -> str | None:
        link = self.home(host_id) / "Narwhal-deploy" / "current"
        return link.readlink().name if link.is_symlink() else None


def local_fleet(tmp_path: Path, count: int, order: list[int] | None = None) -> LocalFleet:
    """A fleet of `count` local hosts; `order` is the inventory's order of host numbers (default 1..count)."""
    numbers = order or list(range(1, count + 1))
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text("".join(f"NARWHAL_NODE_{n}_SSH=local-{n}\n" for n in numbers))
    settings = Settings.load(root, environ={})
    entries = [HostEntry(id=f"node-{n}", ssh_env=f"NARWHAL_NODE_{n}_SSH", roles=[f"engine-{n}"]) for n in numbers]
    revision, bundle = make_source(tmp_path)
    run_dir = tmp_path / "prepared"
    run_dir.mkdir()
    (run_dir / "source.bundle").write_bytes(bundle)
    hosts = []
    for entry in entries:
        role = f"export NARWHAL_ENGINE_PORT='{8000 + int(entry.id.split('-')[1])}'\n".encode()
        path = f"{entry.id}/.env.{entry.roles[0]}"
        (run_dir / entry.id).mkdir()
        (run_dir / path).write_bytes(role)
        hosts.append(ManifestHost(id=entry.id, ssh_env=entry.ssh_env, roles=entry.roles, destination_sha256="0" * 64,
                                  host_key_fingerprints=[FINGERPRINT], files=[_pinned(path, role,
                                  f"runs/deployment/.env.{entry.roles[0]}")]))  # fmt: skip
    manifest = DeploymentManifest(revision=revision, deployment_id=DEPLOYMENT, created_at="2026-12-04T00:00:00Z",
                                  remote_dir=f"Narwhal-deploy/{DEPLOYMENT}", hosts=hosts,
                                  bundle=_pinned("source.bundle", bundle, None))  # fmt: skip
    homes = {e.id: tmp_path / "homes" / e.id for e in entries}
    for home in homes.values():
        home.mkdir(parents=True)
    return LocalFleet(root, entries, settings, PreparedRun(run_dir, manifest), LocalConnector(homes))


def _pinned(path: str, data: bytes, install_to: str | None) -> PreparedFile:
    return PreparedFile(path=path, install_to=install_to, sha256=hashlib.sha256(data).hexdigest(), size=len(data))

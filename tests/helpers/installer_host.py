"""The host-side installer run locally as a host would run it: the guard with the framed program on stdin
(`helpers.host_program`), its own HOME, real git and real files. Shared by the installer's unit tests."""

from __future__ import annotations

import fcntl
import hashlib
import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

from helpers.host_program import run_host_program
from narwhal_assets.host import program_stream
from narwhal_assets.host.installer import CURRENT, FILE_SET, MARKER, VENV
from narwhal_assets.protocols.install import (
    DeploymentEntry,
    InstallReport,
    installer_script,
    parse_install_report,
)

DEPLOYMENT = "0123456789abcdef0123456789abcdef"
REMOTE_DIR = f"Narwhal-deploy/{DEPLOYMENT}"
ROLE_FILE = b"export NARWHAL_ENGINE_PORT='8001'\n"
QUICK_S = 30  # a read that blocked (a FIFO) or a command that hung would take far longer
HOLDER = {"user": "alice", "workstation": "ws-1", "command": "install", "revision": "a" * 40,
          "deployment_id": DEPLOYMENT, "message": "", "since": "2026-12-04T00:00:00Z", "boot": "", "pid": 1,
          "pid_start": ""}  # fmt: skip


def lease(token: str = "t" * 32, mode: str = "acquire", release: str = "after", **extra: object) -> dict[str, Any]:
    """The operation's lease parameters an installer call carries."""
    return {"token": token, "mode": mode, "release": release, "holder": HOLDER, "lease_s": 300.0, **extra}


def make_source(tmp_path: Path) -> tuple[str, bytes]:
    """A one-commit repository (tracked files, an ignored runs/) as its revision and bundle (over 4 KiB)."""
    repo = tmp_path / "repo"
    (repo / "app").mkdir(parents=True)
    (repo / "README").write_text("demo\n")
    (repo / "app" / "main.py").write_text("print('served')\n")
    (repo / "app" / "data.txt").write_text(os.urandom(4096).hex())
    (repo / ".gitignore").write_text("runs/\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    revision = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([*git, "bundle", "create", "-q", str(tmp_path / "b.bundle"), "HEAD"], check=True)
    return revision, (tmp_path / "b.bundle").read_bytes()


class Host:
    """A HOME directory the installer runs in, as the host's user would."""

    def __init__(self, home: Path, revision: str, bundle: bytes, remote_dir: str = REMOTE_DIR) -> None:
        self.home = home
        self.base = home / remote_dir
        self.top = self.base.parent
        self.checkout = self.base / "checkout"
        self.payloads = {"source.bundle": bundle, ".env.engine-1": ROLE_FILE}
        self.params: dict[str, Any] = {
            "remote_dir": remote_dir, "revision": revision, "owner": "unit test", "lease": lease(),
            "install_command": "true", "check_command": "test -n \"$VIRTUAL_ENV\"",
            "files": [{"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                       "install_to": None if name == "source.bundle" else "runs/deployment/.env.engine-1",
                       "keep_if_present": False} for name, data in self.payloads.items()],
        }  # fmt: skip

    def call(self, action: str, send: list[str] | None = None, limit_file_size: int | None = None,
             stream: bytes | None = None, **extra: object) -> InstallReport:  # fmt: skip
        """One installer run; `stream` replaces the sent files' bytes, `limit_file_size` fills the disk early."""
        params = {**self.params, "action": action, **({"send": send} if send is not None else {}), **extra}
        payload = stream if stream is not None else b"".join(self.payloads[name] for name in send or [])
        return self.run(params, payload, limit_file_size)

    def run(self, params: dict[str, Any], payload: bytes = b"", limit_file_size: int | None = None) -> InstallReport:
        """The installer with exactly `params`, as `protocols.install.installer_script` ships it for them."""
        env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}

        def limits() -> None:
            if limit_file_size is not None:  # writes past it fail with EFBIG, as a full disk fails with ENOSPC
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

        done = run_host_program(program_stream(installer_script(params), [payload]), env, QUICK_S * 4,
                                preexec_fn=limits)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return parse_install_report(done.stdout)

    def status(self, **known: dict[str, Any]) -> dict[str, DeploymentEntry]:
        """`status` with what `workflows.status` sends: no lease, so the program is the installer alone."""
        report = self.run({"remote_base": "Narwhal-deploy", "action": "status", "known": known})
        assert report.outcome == "listed", report
        return {d.name: d for d in report.deployments}

    def known(self) -> dict[str, Any]:
        return {self.base.name: {"revision": self.params["revision"], "files": self.params["files"]}}

    def stage(self) -> InstallReport:
        inspected = self.call("inspect")
        return self.call("install", send=[n for n in self.payloads if inspected.files.get(n) != "present"])

    def install(self) -> InstallReport:
        """Stage (the marker written last), then point `current` at it."""
        report = self.stage()
        assert report.outcome == "staged", report
        return self.call("activate")


def installed_home(
    cache: Path, target: Path, copies: tuple[str, ...] = (), marked: bool = True
) -> tuple[Path, str, bytes]:
    """A copy at `target` of a home where REMOTE_DIR was installed (`Host.install`, asserted activated), with
    the source's revision and bundle. `copies`: more deployment directories holding the same installation, as
    installing the same revision there before REMOTE_DIR leaves them (`current` stays at REMOTE_DIR; only
    absolute paths differ, inside `.venv` and the checkout's origin URL, which no check reads). `marked=False`:
    every deployment as an install that stopped just before its marker leaves it (a failed check, a killed
    installer): files, checkout and `.venv` complete, no `installed`, no `.installed-files`, no `current`. For
    tests whose subject is not the virtualenv's creation: it takes seconds of CPU, so the home is installed once
    per run (`cache`: a directory every pytest worker sees, locked while one builds it) and copied (`link_copy`)."""
    built = cache / "home-installed"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "home-installed.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (built / "complete").exists():
            shutil.rmtree(built, ignore_errors=True)  # a worker stopped while building it
            built.mkdir()
            (built / "home").mkdir()
            assert Host(built / "home", *make_source(built)).install().outcome == "activated"
            (built / "complete").touch()
    sealed_ns = (built / "complete").stat().st_mtime_ns
    link_copy(built / "home", target, sealed_ns)
    for remote_dir in copies:
        link_copy(target / REMOTE_DIR, target / remote_dir, sealed_ns)
    deployment = target / REMOTE_DIR
    revision = (deployment / MARKER).read_text().strip()
    if not marked:
        for remote_dir in (REMOTE_DIR, *copies):
            for name in (MARKER, FILE_SET):
                (target / remote_dir / name).unlink()
        (deployment.parent / CURRENT).unlink()
    return target, revision, (deployment / "source.bundle").read_bytes()


def link_copy(source: Path, target: Path, sealed_ns: int) -> None:
    """`source` copied to `target`, but for the files inside a `.venv`: hard links to the built ones (copying the
    25 MB of a virtualenv costs a CPU-second each time). Tests remove, replace or rebuild those files, as the
    installer does, and never write into one: a linked file changed after `sealed_ns` (when the build completed)
    fails the copy, naming it."""

    def link_or_copy(src: str, dst: str) -> None:
        if VENV not in Path(src).relative_to(source).parts:
            shutil.copy2(src, dst)
            return
        assert os.stat(src).st_mtime_ns <= sealed_ns, (
            f"{src}: written into after the build (a test may remove or replace a linked .venv file, never write it)"
        )
        os.link(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)

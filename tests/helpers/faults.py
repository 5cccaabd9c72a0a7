"""Breaking a simulated host for a while and seeing what it still runs: replaced tools, start markers, a disk
that can be filled, and processes looked up through /proc (the hosts share this machine's PID namespace), by
the host user's uid or by the session of a command started here."""

from __future__ import annotations

import pwd
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetsim import SimFleet

from helpers.files import replaced_file

KEEPALIVE_LOST = "connection lost: no reply to keep-alive within 3 s (1 s x 3)"
GUARD = "Command guard"  # in the guard's argv (its source), so it finds guards too
STARTED = ".narwhal-fault-started"
STALL = f'#!/bin/sh\ntouch "$HOME/{STARTED}"\nexec sleep 3600\n'


def host_processes(fleet: SimFleet, name: str, needle: str) -> list[str]:
    """`pid: argv` of every process of the host's user whose argv contains `needle`."""
    uid = pwd.getpwnam(fleet.host(name).user).pw_uid
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if needle in argv:
            found.append(f"{proc.name}: {argv[:120]}")
    return found


def gone(fleet: SimFleet, name: str, *needles: str, patience: float = 30.0) -> list[str]:
    """Wait (a liveness bound, not a speed check) until no such process is left; returns what is left."""
    deadline = time.monotonic() + patience
    while True:
        left = [p for needle in needles for p in host_processes(fleet, name, needle)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@contextmanager
def host_tool(fleet: SimFleet, name: str, tool: str, script: str) -> Iterator[None]:
    """Replace (or add) `/usr/local/bin/<tool>` on one host for the duration; restored afterwards."""
    path = fleet.host(name).hostdir / "bin" / tool
    if path.exists():
        with replaced_file(path, script.encode()):
            yield
        return
    path.write_text(script, encoding="utf-8")
    path.chmod(0o755)
    try:
        yield
    finally:
        path.unlink()


def started_marker(fleet: SimFleet, name: str) -> Path:
    """Workstation-side path of `$HOME/.narwhal-fault-started` on the host (its home is bind-mounted)."""
    return fleet.host(name).home / STARTED


def when_started(names: list[str], fleet: SimFleet, then: Callable[[], None]) -> threading.Thread:
    """Run `then` once every named host's tool has written its start marker (the probe is mid-run)."""

    def wait() -> None:
        deadline = time.monotonic() + 120
        while not all(started_marker(fleet, n).exists() for n in names) and time.monotonic() < deadline:
            time.sleep(0.1)
        then()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def live_processes(*, uid: int | None = None, session: int | None = None, needle: str | None = None) -> list[str]:
    """`pid: argv` of every process not yet exited that is of `uid`, in `session` and has `needle` in its argv
    (each where given): a zombie holds nothing, however slowly its parent (a killed sshd session's init) reaps."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            owner = proc.stat().st_uid
            fields = (proc / "stat").read_bytes().rsplit(b")", 1)[-1].split()
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if fields[0] in (b"Z", b"X") or (uid is not None and owner != uid):
            continue
        if (session is None or int(fields[3]) == session) and (needle is None or needle in argv):
            found.append(f"{proc.name}: {argv[:120]}")
    return found


def user_processes(fleet: SimFleet, name: str) -> list[str]:
    """Every live process the host's user runs (sshd sessions included): none once nothing is connected."""
    return live_processes(uid=pwd.getpwnam(fleet.host(name).user).pw_uid)


def none_left(probe: Callable[[], list[str]], patience: float = 30.0) -> list[str]:
    """Wait (a liveness bound, not a speed check) until `probe` finds nothing; returns what it last found."""
    deadline = time.monotonic() + patience
    while True:
        left = probe()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at the new directory `path` (0700) for the duration: a disk that can be filled.
    Mounted before a simulated host starts, at its home, it is that host's disk (its sshd binds the home)."""
    path.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)

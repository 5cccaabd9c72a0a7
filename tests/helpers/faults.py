"""Breaking a simulated host for a while and seeing what it still runs: replaced tools, start markers, and
processes looked up through /proc (the hosts share this machine's PID namespace), by the host user's uid."""

from __future__ import annotations

import pwd
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

"""`dagster dev` (webserver + daemon + code server) as a test runs it: its own process group, stopped by group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from helpers.loopback import free_port

CHROMIUM = Path("/usr/bin/chromium")  # Debian's `chromium` package; Playwright never downloads a browser here
WORKSPACE = Path(__file__).resolve().parents[2] / "workspace.yaml"
READY_S = 240.0
# dagster dev gives the webserver, then the daemon, 60 s each to stop before it kills them (dagster._cli.dev,
# _SUBPROCESS_WAIT_TIMEOUT), and its code server goes after: waiting less fails a shutdown that load only slowed.
STOP_S = 2 * 60.0 + 60.0


def require_browser() -> None:
    """Skip without Chromium or Playwright; under CI fail instead (the UI test must run there)."""
    missing = [] if CHROMIUM.is_file() else [f"{CHROMIUM} (Debian package chromium)"]
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (the test extra)")
    if not missing:
        return
    reason = "browser test unavailable, missing: " + "; ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: must run, not skip)", pytrace=False)
    pytest.skip(reason)


@contextmanager
def dagster_dev(root: Path, home: Path, workdir: Path) -> Iterator[str]:
    """Start `dagster dev` for checkout `root` (instance `home`) in `workdir` (no .env there, so no secret enters
    its environment); yield the UI's base URL once it serves; stop the whole process group afterwards."""
    port, log = free_port(), workdir / "dagster-dev.log"
    env = {**os.environ, "NARWHAL_ROOT": str(root), "DAGSTER_HOME": str(home), "DAGSTER_DISABLE_TELEMETRY": "1"}
    args = [sys.executable, "-m", "dagster", "dev", "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=as_an_operator_starts_it)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, log)
        yield url
    finally:
        stop_group(process)


def as_an_operator_starts_it() -> None:
    """Umask 077, as the README says to start `dagster dev` (the webserver and daemon never load our code,
    which sets it for its own processes); and default SIGINT: dagster dev turns SIGTERM into whatever SIGINT
    does, and a caller started in the background (CI) passes SIGINT down ignored."""
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until_serving(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dagster dev exited {process.returncode}:\n{tail(log)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"dagster dev did not serve {url} within {READY_S:.0f}s:\n{tail(log)}", pytrace=False)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group (dagster dev, webserver, daemon, code server, run workers), then wait until no
    member is left (the condition, not dagster dev's own exit: its children may outlive it); SIGKILL and fail if
    they do not stop within STOP_S."""
    group = process.pid
    with suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    if group_members(group):
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        process.wait(timeout=STOP_S)
        pytest.fail("dagster dev's process group did not stop on SIGTERM", pytrace=False)
    process.wait(timeout=STOP_S)  # its leader is a zombie by now (group_members leaves those out)


def group_members(group: int) -> list[int]:
    """Live (not zombie) processes of the group, from /proc/<pid>/stat (state and pgrp follow the `(comm)`)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(stat.parent.name))
    return members


def tail(path: Path, size: int = 4000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-size:]

"""`deploy-hosts ui` as an operator starts it: from the checkout (where `.env` holds a password), under the usual
umask 022. No process of the UI's tree may hold the password or a destination in its environment, every one
runs at umask 077, the page loads in Chromium on 127.0.0.1, and SIGTERM stops the whole tree within seconds.
No fleet: the UI only needs the checkout and its instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from helpers.dagster_dev import CHROMIUM, require_browser
from helpers.loopback import free_port
from helpers.procfs import alive, proc_fields
from playwright.sync_api import expect, sync_playwright

PASSWORD = "SENTINEL-PW-first-day"
DESTINATION = "SENTINEL-DEST-ops@gpu-a.example"
READY_S = 240.0
STOP_S = 15.0  # "within seconds": the command interrupts, then kills after 8 s
SERVING = "deploy-hosts ui: serving "


def tree(root_pid: int) -> set[int]:
    """`root_pid` and every live descendant, by parent id."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = proc_fields(int(stat.parent.name))
        if fields and fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, grew = {root_pid}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir(mode=0o700)
    (root / ".env").write_text(f"NARWHAL_NODE_1_SSH='{DESTINATION}'\nNARWHAL_NODE_1_SSH_PASSWORD='{PASSWORD}'\n")
    (root / ".env").chmod(0o600)
    return root


@pytest.fixture
def ui(checkout: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """`python -m narwhal_assets ui --port P` in the checkout, umask 022; yields it once it says it serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    out = tmp_path / "ui.out"
    with out.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "narwhal_assets", "ui", "--port", str(port)], cwd=checkout, env=env,
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: os.umask(0o022),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + READY_S
        while SERVING not in out.read_text():
            assert process.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        yield process, f"http://127.0.0.1:{port}", out
    finally:
        for pid in tree(process.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_ui_keeps_secrets_out_of_every_process_and_stops_on_sigterm(
    ui: tuple[subprocess.Popen[str], str, Path], checkout: Path
) -> None:
    require_browser()
    process, url, out = ui
    assert f"{SERVING}{url} " in out.read_text()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        page = browser.new_page()
        page.goto(f"{url}/assets", timeout=120_000)
        expect(page.get_by_role("link", name="host_inventory").first).to_be_visible(timeout=120_000)
        browser.close()

    members = tree(process.pid)
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in members if alive(pid)}
    assert len(commands) >= 5, commands  # deploy-hosts, dagster dev, webserver, daemon, code server(s)
    for pid in commands:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert PASSWORD.encode() not in environ, commands[pid]
        assert DESTINATION.encode() not in environ, commands[pid]
        status = Path(f"/proc/{pid}/status").read_text()
        assert "Umask:\t0077" in status, commands[pid]
        assert Path(os.readlink(f"/proc/{pid}/cwd")) != checkout or pid == process.pid, commands[pid]

    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=STOP_S) == 0, out.read_text()
    assert time.monotonic() - started < STOP_S
    left = [commands[pid] for pid in commands if alive(pid)]
    assert left == [], left
    text = out.read_text()
    assert "SIGTERM: stopping Dagster" in text
    assert "SENTINEL" not in text
    log = checkout / "runs" / "dagster" / "ui.log"
    assert b"SENTINEL" not in log.read_bytes()
    assert b"SupersessionWarning" not in log.read_bytes()
    assert (log.stat().st_mode & 0o777) == 0o600

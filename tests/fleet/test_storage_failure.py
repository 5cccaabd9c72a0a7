"""Dagster's storage fails right after a discovery published its config set (runner.py's StorageError).

Deterministic: a planted earlier run holds a FIFO named like a checkpoint record. Pruning, which runs under
the publish lock right after the new set is in place, reads every run's records, so it blocks opening the
FIFO exactly after the publish. The test then fills the tmpfs under DAGSTER_HOME and lets the read finish:
every later Dagster event write fails with a full disk.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.fleet_checkout import DESTINATIONS, PASSWORD

TMPFS_SIZE = "16m"
WAIT_S = 240.0


def _open_writer_when_read(fifo: Path, proc: subprocess.Popen[str]) -> int:
    """The FIFO's write end, opened only once the discovery is blocked reading it (i.e. it has published)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"discovery never reached pruning: {proc.communicate()[1]}")


def _fill(directory: Path) -> None:
    """Write zeros until the filesystem is full."""
    with (directory / "filler").open("wb") as handle:
        block = bytes(1 << 16)
        try:
            while True:
                handle.write(block)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_a_publish_followed_by_a_storage_failure_reports_the_publish_and_the_missing_lineage(
    checkout: Path,
    tmp_path: Path,
) -> None:
    """Exit 1, one line that says the set was published and its lineage was not recorded, no traceback; the
    new set is complete in config/ (every file the run's manifest lists, with the listed SHA-256)."""
    home = tmp_path / "tiny-dagster-home"
    home.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(home)], check=True)
    try:
        planted = checkout / "runs" / "discovery" / "20000101T000000Z-f1f0f0"
        planted.mkdir(mode=0o700, parents=True)
        os.chmod(planted.parent, 0o700)
        os.chmod(planted.parent.parent, 0o700)
        fifo = planted / "engine-1-checkpoint.json"
        os.mkfifo(fifo, 0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")} | {"DAGSTER_HOME": str(home)}
        command = [sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "discover"]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        writer = _open_writer_when_read(fifo, proc)
        try:
            _fill(home)
            os.write(writer, b"not a record\n")
        finally:
            os.close(writer)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)

    assert proc.returncode == 1, out + err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    run_dir = next(p for p in planted.parent.iterdir() if (p / "manifest.json").is_file())
    assert f"the config set of {run_dir} was published" in lines[0], lines[0]
    assert "recording it in Dagster storage failed, so its lineage is incomplete" in lines[0], lines[0]
    assert lines[0].startswith("deploy-hosts discover: error: discovery_job stopped: OperationalError: "), lines[0]
    assert not [secret for secret in (PASSWORD, *DESTINATIONS.values()) if secret in out + err]
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["files"], manifest
    for rel, sha256 in manifest["files"].items():
        assert hashlib.sha256((checkout / rel).read_bytes()).hexdigest() == sha256, rel

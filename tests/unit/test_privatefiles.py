"""Private files: modes, atomic replacement, and the exclusive lock that serializes publishers."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from narwhal_assets.privatefiles import exclusive_lock, write_private

TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_private_creates_every_missing_directory_0700_and_the_file_0600(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "file.json"
    digest = write_private(target, "{}\n")
    assert target.read_text() == "{}\n" and len(digest) == 64
    assert mode(target) == 0o600 and mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    target.chmod(0o644)
    write_private(target, "new\n")
    assert mode(target) == 0o600 and target.read_text() == "new\n"
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]  # no temp file left behind


def test_exclusive_lock_keeps_another_process_out_until_released(tmp_path: Path) -> None:
    lock = tmp_path / "runs" / ".publish.lock"
    with exclusive_lock(lock):
        held = subprocess.run([sys.executable, "-c", TRY_LOCK, str(lock)], check=False)
        assert held.returncode == 3
        assert mode(lock) == 0o600
    free = subprocess.run([sys.executable, "-c", TRY_LOCK, str(lock)], check=False)
    assert free.returncode == 0

"""Private files: modes, atomic replacement, and the exclusive lock that serializes publishers."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from narwhal_assets.local.privatefiles import exclusive_lock, non_private, write_private

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


def test_non_private_walks_directories_and_names_each_loose_entry(tmp_path: Path) -> None:
    """The scan behind the private-modes check: any group/other bit is reported, symlinks are not followed."""
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    outside.chmod(0o644)
    root = tmp_path / "instance"
    (root / "history" / "runs").mkdir(parents=True, mode=0o700)
    for directory in (root, root / "history", root / "history" / "runs"):
        directory.chmod(0o700)
    (root / "storage").mkdir(mode=0o700)
    (root / "storage").chmod(0o755)
    (root / "history" / "runs.db").write_text("")
    (root / "history" / "runs.db").chmod(0o644)
    (root / "history" / "runs" / "a.db").write_text("")
    (root / "history" / "runs" / "a.db").chmod(0o600)
    (root / "history" / "runs" / "b.db").write_text("")
    (root / "history" / "runs" / "b.db").chmod(0o604)
    (root / "read-only").write_text("")
    (root / "read-only").chmod(0o400)  # private too: no group or other bit
    (root / "link").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    single = tmp_path / "fleet.json"
    single.write_text("{}")
    single.chmod(0o640)
    problems = non_private([single, root, tmp_path / "missing"])
    assert problems == [
        f"{single}: mode 0640, expected 0600",
        f"{root / 'storage'}: mode 0755, expected 0700",
        f"{root / 'history' / 'runs.db'}: mode 0644, expected 0600",
        f"{root / 'history' / 'runs' / 'b.db'}: mode 0604, expected 0600",
    ]
    for path in (single, root / "storage", root / "history" / "runs.db", root / "history" / "runs" / "b.db"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    assert non_private([single, root]) == []

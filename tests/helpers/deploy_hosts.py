"""`deploy-hosts` run in this process, and the discovery runs it leaves in a checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from narwhal_assets.cli.main import main
from narwhal_assets.local.checkpoint_store import OBJECTS_DIR


def cli(root: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["--root", str(root), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def discover(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Path:
    """A discovery that must succeed; returns its run directory (as the command prints it)."""
    rc, out, err = cli(root, "discover", *args, capsys=capsys)
    assert rc == 0, err
    match = re.search(r"^discovery run (\S+)$", out, re.MULTILINE)
    assert match, out
    return Path(match.group(1))


def prepare(root: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """`deploy-hosts prepare` into the checkout's own deployment directory (where `status` finds it); returns
    the run it made."""
    rc, out, err = cli(root, "prepare", capsys=capsys)
    assert rc == 0, err
    match = re.search(r"^output directory (\S+)$", out, re.MULTILINE)
    assert match, out
    return Path(match.group(1))


def failing_discover(root: Path, capsys: pytest.CaptureFixture[str], rc: int = 2) -> tuple[str, Path | None]:
    """A discovery that must fail with exit `rc` (2: bad input, 1: a host failed); returns stderr and the
    run directory it created (if any)."""
    before = set(run_dirs(root))
    got, out, err = cli(root, "discover", capsys=capsys)
    assert got == rc, out + err
    assert err.strip(), "a failed discovery explains itself on stderr"
    new = sorted(set(run_dirs(root)) - before)
    assert len(new) <= 1
    return err, new[0] if new else None


def run_dirs(root: Path) -> list[Path]:
    base = root / "runs" / "discovery"
    return sorted(p for p in base.iterdir() if p.is_dir() and p.name != OBJECTS_DIR) if base.is_dir() else []

"""`deploy-hosts check-access` and `trust` (`cli/access.py`): a bad `--timeout` or `--fingerprint` exits 2
before any connection is tried."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.env_checkout import run_cli, write_checkout


@pytest.mark.parametrize("fingerprint", ["SHA256:short", "MD5:aa:bb", "SHA256:" + "A" * 43 + "!", ""])
def test_trust_with_a_malformed_fingerprint_exits_2_before_connecting(tmp_path: Path, fingerprint: str) -> None:
    root = write_checkout(tmp_path / "c")
    done = run_cli(root, "trust", "--host", "node-1", "--fingerprint", fingerprint)
    assert done.returncode == 2, done.stderr
    assert "--fingerprint: expected SHA256:<43 base64 characters>" in done.stderr
    assert "cannot connect" not in done.stderr


def test_check_access_timeout_must_be_positive(tmp_path: Path) -> None:
    done = run_cli(write_checkout(tmp_path / "c"), "check-access", "--timeout", "0")
    assert done.returncode == 2 and "expected seconds from 0.1 to 3600" in done.stderr

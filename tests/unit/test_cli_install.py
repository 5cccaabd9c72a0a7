"""`deploy-hosts install` refuses, before it reads the checkout or touches a host, what the lease could not carry
or what contradicts itself: exit 2, one line per problem, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal_assets.cli.main import main
from narwhal_assets.workflows.lease import MESSAGE_LIMIT, message_problems


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--activate", "none", "--canary", "1"], "--canary: activates the canary hosts, --activate none activates"),
        (["--message", "x" * (MESSAGE_LIMIT + 1)], f"--message: at most {MESSAGE_LIMIT} bytes (UTF-8)"),
        (["--message", "é" * (MESSAGE_LIMIT // 2 + 1)], f"--message: at most {MESSAGE_LIMIT} bytes (UTF-8)"),
        (["--message", "one\nline"], "--message: one line of printable text"),
        (["--message", "bell\x07"], "--message: one line of printable text"),
    ],
)
def test_install_refuses_bad_options_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    root = tmp_path / "checkout"  # no checkout at all: the options are refused before one is read
    rc = main(["--root", str(root), "install", "--run", str(tmp_path / "run"), *args])
    _, err = capsys.readouterr()
    assert rc == 2 and said in err and "Traceback" not in err, err
    assert not root.exists() and not (tmp_path / "run").exists()


def test_a_message_at_the_limit_is_taken() -> None:
    assert message_problems("x" * MESSAGE_LIMIT) == [] and message_problems("hotfix: café 1234") == []

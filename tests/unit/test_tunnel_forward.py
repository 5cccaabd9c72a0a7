"""`tunnel --forward`: what reaches OpenSSH's `-L` is a forward it accepts, IPv6 hosts in brackets; anything
else is refused as bad input before OpenSSH runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal_assets.cli.interactive import parse_forward
from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import openssh_command


def local_forward(text: str, tmp_path: Path) -> str:
    command = openssh_command(resolve_endpoint("u@t", None), tmp_path / "kh", forwards=[parse_forward(text)])
    return command.argv[command.argv.index("-L") + 1]


@pytest.mark.parametrize(("given", "expected"), [
    ("8080:22", "127.0.0.1:8080:127.0.0.1:22"),
    ("8080:db.internal:5432", "127.0.0.1:8080:db.internal:5432"),
    ("8080:[::1]:22", "127.0.0.1:8080:[::1]:22"),
    ("8080:[fe80::0001]:22", "127.0.0.1:8080:[fe80::1]:22"),
])  # fmt: skip
def test_forwards_reach_openssh_as_it_parses_them(given: str, expected: str, tmp_path: Path) -> None:
    assert local_forward(given, tmp_path) == expected


@pytest.mark.parametrize("given", ["8080:::1:22", "8080:[nothex]:22", "8080:[1.2.3.4]:22", "0:22", "8080:70000"])
def test_malformed_forwards_are_refused_as_input(given: str) -> None:
    with pytest.raises(InputError):
        parse_forward(given)

"""`tunnel --forward`: what reaches OpenSSH's `-L` is a forward it accepts, IPv6 hosts in brackets; anything
else (a local port given twice included) is refused as bad input before OpenSSH runs; `--role` defaults to the
router's host, as upstream's."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal_assets.cli.main import build_parser, main
from narwhal_assets.cli.tunnel import parse_forward, parse_forwards
from narwhal_assets.core.errors import InputError
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import openssh_command
from narwhal_assets.workflows.shell import role_host_openssh


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


def tunnel_args(root: Path, *forwards: str) -> object:
    return build_parser().parse_args(["--root", str(root), "tunnel", *(f"--forward={f}" for f in forwards)])


def test_tunnel_defaults_to_the_router_and_refuses_a_local_port_given_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text("NARWHAL_ROUTER_SSH=u@[127.0.0.3]:2203\nNARWHAL_NODE_1_SSH=u@[127.0.0.4]:2204\n")
    args = tunnel_args(root, "18000:8000", "19090:9090")
    command = role_host_openssh(Checkout.open(root), args.role, forwards=parse_forwards(args.forward))  # type: ignore[attr-defined]
    assert args.role == "router"  # type: ignore[attr-defined]
    argv = command.argv
    assert argv[argv.index("-p") + 1] == "2203" and argv[-1] == "127.0.0.3"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-L"] == ["127.0.0.1:18000:127.0.0.1:8000",
                                                                      "127.0.0.1:19090:127.0.0.1:9090"]  # fmt: skip
    capsys.readouterr()
    rc = main(["--root", str(root), "tunnel", "--forward", "18000:8000", "--forward", "18000:9090"])
    assert rc == 2
    assert "--forward: local port 18000 given more than once" in capsys.readouterr().err

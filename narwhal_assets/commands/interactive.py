"""`shell` and `tunnel`: exec OpenSSH (strict, checkout store) for the host owning a role."""

from __future__ import annotations

import argparse
import os
import re

from narwhal_assets.checkout import Checkout
from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import OpenSshCommand, openssh_command

FORWARD_RE = re.compile(r"(\d+):(?:(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):)?(\d+)")


def parse_forward(text: str) -> tuple[int, str, int]:
    """`LOCAL:REMOTE` or `LOCAL:HOST:REMOTE`; the remote host defaults to the engine host's loopback."""
    match = FORWARD_RE.fullmatch(text)
    ports = [int(match.group(1)), int(match.group(3))] if match else []
    if not match or not all(1 <= p <= 65535 for p in ports):
        raise InputError(["--forward: expected LOCAL:REMOTE or LOCAL:HOST:REMOTE with ports 1..65535"])
    return ports[0], (match.group(2) or "127.0.0.1").strip("[]"), ports[1]


def build(args: argparse.Namespace, remote_command: str | None = None) -> OpenSshCommand:
    checkout = Checkout.open(args.root)
    entry = checkout.inventory.host_for_role(args.role)
    access = host_access(checkout.settings, entry)
    endpoint = resolve_endpoint(access.destination, checkout.settings.ssh_config_path)
    forward = parse_forward(args.forward) if getattr(args, "forward", None) else None
    return openssh_command(
        endpoint,
        checkout.settings.known_hosts_path,
        checkout.settings.ssh_config_path,
        password=access.password,
        remote_command=remote_command,
        forward=forward,
    )


def exec_openssh(command: OpenSshCommand) -> int:
    """Replace this process with OpenSSH, so the terminal, signals and exit status are its own."""
    command.prepare_password_pipe()
    os.execvp(command.argv[0], command.argv)
    return 127  # pragma: no cover - execvp does not return


def shell(args: argparse.Namespace) -> int:
    return exec_openssh(build(args))


def tunnel(args: argparse.Namespace) -> int:
    return exec_openssh(build(args))


def register(sub: argparse._SubParsersAction) -> None:
    sh = sub.add_parser("shell", help="interactive shell on the host owning --role")
    sh.add_argument("--role", required=True)
    sh.set_defaults(func=shell)
    tn = sub.add_parser("tunnel", help="forward a local port to the host owning --role")
    tn.add_argument("--role", required=True)
    tn.add_argument("--forward", required=True, metavar="LOCAL:REMOTE")
    tn.set_defaults(func=tunnel)

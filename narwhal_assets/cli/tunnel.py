"""`deploy-hosts tunnel [--role ROLE] --forward LOCAL:[HOST:]REMOTE ...`: local ports forwarded to a role's host.

OpenSSH (`ssh -N -L ...`, strict, the checkout's store) runs as a child until a signal or the connection ends
it, and nothing it started is left afterwards (ssh/openssh_process.py); exit status: ssh's.
"""

from __future__ import annotations

import argparse
import ipaddress
import re

from narwhal_assets.core.errors import InputError

FORWARD_RE = re.compile(r"(\d+):(?:(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):)?(\d+)")


def parse_forward(text: str) -> tuple[int, str, int]:
    """`LOCAL:REMOTE` or `LOCAL:HOST:REMOTE`; the remote host defaults to the engine host's loopback."""
    match = FORWARD_RE.fullmatch(text)
    ports = [int(match.group(1)), int(match.group(3))] if match else []
    if not match or not all(1 <= p <= 65535 for p in ports):
        raise InputError(["--forward: expected LOCAL:REMOTE or LOCAL:HOST:REMOTE with ports 1..65535"])
    host = match.group(2) or "127.0.0.1"
    if host.startswith("["):  # an IPv6 address, written in brackets as OpenSSH wants it
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise InputError([f"--forward: {host} is not an IPv6 address in brackets"]) from None
    return ports[0], host, ports[1]


def parse_forwards(texts: list[str]) -> list[tuple[int, str, int]]:
    """Every `--forward`, each local port at most once (OpenSSH would serve only one of them)."""
    forwards = [parse_forward(text) for text in texts]
    locals_ = [local for local, _, _ in forwards]
    repeated = sorted({port for port in locals_ if locals_.count(port) > 1})
    if repeated:
        raise InputError([f"--forward: local port {', '.join(map(str, repeated))} given more than once; "
                          "select a distinct local port for each forward"])  # fmt: skip
    return forwards


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.openssh_process import run_openssh
    from narwhal_assets.workflows.shell import role_host_openssh

    forwards = parse_forwards(args.forward)
    checkout = Checkout.open(args.root)
    return run_openssh(role_host_openssh(checkout, args.role, forwards=forwards))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tn = sub.add_parser("tunnel", help="forward local ports to the host owning --role")
    tn.add_argument("--role", default="router", metavar="ROLE",
                    help="router (the default) or engine-<n>: the host owning it")  # fmt: skip
    tn.add_argument("--forward", required=True, action="append", metavar="LOCAL:[HOST:]REMOTE",
                    help="listen on 127.0.0.1:LOCAL, connect to HOST:REMOTE as seen from that host "
                    "(HOST defaults to its loopback); repeat for more ports, each LOCAL once")  # fmt: skip
    tn.set_defaults(func=run)

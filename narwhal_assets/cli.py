"""`deploy-hosts`: the operator's command line. Artifact-producing commands materialize the same assets."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.core.settings import Settings
from narwhal_assets.inventory_file import current_inventory
from narwhal_assets.runner import materialize_selection, operator_instance

EXIT_INPUT = 2


def cmd_plan(args: argparse.Namespace) -> int:
    """Validate (or derive) the inventory through the `host_inventory` asset and show it."""
    root = args.root
    materialize_selection("host_inventory", operator_instance(root), root)
    settings = Settings.load(root)
    inventory = current_inventory(settings)
    print(f"inventory {settings.hosts_path}: {len(inventory.hosts)} physical host(s)")
    for host in inventory.hosts:
        auth = f"password ({host.password_env})" if host.password_env else "key/agent"
        print(f"  {host.id:<12} roles={','.join(host.roles):<24} ssh_env={host.ssh_env}  auth={auth}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deploy-hosts", description=__doc__)
    parser.add_argument(
        "--root", type=Path, default=Path.cwd(), help="management checkout (default: current directory)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="validate the host inventory and print hosts with roles").set_defaults(
        func=cmd_plan
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = args.root.resolve()
    try:
        return int(args.func(args))
    except NarwhalError as exc:
        for line in str(exc).splitlines():
            print(f"deploy-hosts {args.command}: error: {line}", file=sys.stderr)
        return EXIT_INPUT

"""`deploy-hosts plan`: validate (or derive) the inventory through the `host_inventory` asset."""

from __future__ import annotations

import argparse

from narwhal_assets.core.inventory import load_inventory
from narwhal_assets.core.settings import Settings
from narwhal_assets.runner import materialize_selection, operator_instance


def run(args: argparse.Namespace) -> int:
    materialize_selection("host_inventory", operator_instance(args.root), args.root)
    path = Settings.load(args.root).hosts_path
    inventory = load_inventory(path)
    print(f"inventory {path}: {len(inventory.hosts)} physical host(s)")
    for host in inventory.hosts:
        auth = f"password ({host.password_env})" if host.password_env else "key/agent"
        print(f"  {host.id:<12} roles={','.join(host.roles):<24} ssh_env={host.ssh_env}  auth={auth}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("plan", help="validate the host inventory and print hosts with roles").set_defaults(func=run)

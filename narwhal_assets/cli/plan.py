"""`deploy-hosts plan`: validate (or derive) the inventory and print it. Read-only: it writes nothing and
creates no Dagster run; `discover` (the `host_inventory` asset) saves a derived inventory."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout

    checkout = Checkout.open(args.root)
    path = checkout.settings.hosts_path
    print(f"inventory {path}: {len(checkout.inventory.hosts)} physical host(s)")
    for host in checkout.inventory.hosts:
        auth = f"password ({host.password_env})" if host.password_env else "key/agent"
        print(f"  {host.id:<12} roles={','.join(host.roles):<24} ssh_env={host.ssh_env}  auth={auth}")
    if not checkout.inventory_saved:
        print(f"derived from .env and not saved yet: `deploy-hosts discover` writes {path}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_text = "validate the host inventory and print each host with its roles (writes nothing)"
    parser = sub.add_parser("plan", help=help_text, description=help_text)
    parser.set_defaults(func=run)

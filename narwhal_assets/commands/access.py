"""`check-access` (one strict connection per host) and `trust` (replace a verified changed key)."""

from __future__ import annotations

import argparse
import sys

from narwhal_assets.commands.context import Checkout, add_selection
from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.ssh.access import host_access, host_accesses, make_connector
from narwhal_assets.ssh.transport import HostConnection
from narwhal_assets.ssh.trust import TrustMode

EXIT_FAILED = 1


def _observe(connection: HostConnection) -> tuple[str, str]:
    """The remote hostname (a label only) and the verified host key fingerprint (the identity)."""
    result = connection.run("hostname", timeout=30)
    label = result.text().strip() if result.rc == 0 else f"(hostname exited {result.rc})"
    return label, connection.fingerprint


def check_access(args: argparse.Namespace) -> int:
    checkout = Checkout.open(args.root)
    entries = checkout.selected(args)
    connector = make_connector(checkout.settings, TrustMode.STRICT, connect_timeout=args.timeout)
    results = connector.map_hosts(host_accesses(checkout.settings, entries), _observe)
    failed = 0
    for entry in entries:
        outcome = results[entry.id]
        roles = ",".join(entry.roles)
        if isinstance(outcome, NarwhalError):
            failed += 1
            print(f"FAIL {entry.id:<10} roles={roles}: {outcome}", file=sys.stderr)
        else:
            label, fingerprint = outcome
            print(f"ok   {entry.id:<10} roles={roles} hostname={label} (label) key={fingerprint}")
    return EXIT_FAILED if failed else 0


def trust(args: argparse.Namespace) -> int:
    checkout = Checkout.open(args.root)
    entry = checkout.inventory.host(args.host_id)
    access = host_access(checkout.settings, entry)
    connector = make_connector(checkout.settings, TrustMode.STRICT, connect_timeout=args.timeout)
    endpoint, presented = connector.presented_key(access)
    connector.store.replace(entry.id, endpoint.host, endpoint.port, presented, args.fingerprint)
    with connector.connect(access) as connection:
        print(f"trusted {entry.id} ({endpoint.address}) key {connection.fingerprint} in {connector.store.path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser("check-access", help="one strict SSH connection per physical host")
    add_selection(check)
    check.add_argument("--timeout", type=float, default=10.0, help="connect timeout in seconds (default 10)")
    check.set_defaults(func=check_access)
    replace = sub.add_parser("trust", help="replace a host's key after verifying it out of band")
    replace.add_argument("--host", dest="host_id", required=True, metavar="ID", help="the inventory host id")
    replace.add_argument("--fingerprint", required=True, metavar="SHA256:...",
                         help="the new key's fingerprint, verified out of band")  # fmt: skip
    replace.add_argument("--timeout", type=float, default=10.0, help="connect timeout in seconds (default 10)")
    replace.set_defaults(func=trust)

"""`check-access` (one strict connection per host) and `trust` (replace a verified changed key)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING

from narwhal_assets.cli.selection import add_selection
from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError, NarwhalError

if TYPE_CHECKING:
    from narwhal_assets.ssh.transport import HostConnection

EXIT_FAILED = 1
FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def seconds(text: str) -> float:
    """An argparse type: a timeout from 0.1 to 3600 seconds (argparse exits 2 otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError("expected seconds from 0.1 to 3600")
    return value


def _observe(connection: HostConnection) -> tuple[str, str]:
    """The remote hostname (a label only, as the host printed it) and the verified host key fingerprint."""
    result = connection.run("hostname")
    label = result.text().strip() if result.rc == 0 else f"(hostname exited {result.rc})"
    return label, connection.fingerprint


def check_access(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.access import host_accesses, make_connector
    from narwhal_assets.ssh.trust import TrustMode

    checkout = Checkout.open(args.root)
    entries = checkout.select(args.host or (), args.role or ())
    connector = make_connector(
        checkout.settings, TrustMode.STRICT, connect_timeout=args.timeout, command_timeout=args.timeout
    )
    results = connector.map_hosts(host_accesses(checkout.settings, entries), _observe)
    failed = 0
    for entry in entries:
        outcome = results[entry.id]
        roles = ",".join(entry.roles)
        if isinstance(outcome, NarwhalError):
            failed += 1
            for line in str(outcome).split("\n"):
                print(f"FAIL {entry.id:<10} roles={roles}: {printable(line, None)}", file=sys.stderr)
        else:
            label, fingerprint = outcome
            print(f"ok   {entry.id:<10} roles={roles} hostname={printable(label)} (label) key={fingerprint}")
    return EXIT_FAILED if failed else 0


def trust(args: argparse.Namespace) -> int:
    if not FINGERPRINT_RE.fullmatch(args.fingerprint):
        raise InputError(["--fingerprint: expected SHA256:<43 base64 characters>, as `ssh-keygen -lf` prints it"])
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.access import host_access, make_connector
    from narwhal_assets.ssh.trust import TrustMode

    checkout = Checkout.open(args.root)
    entry = checkout.inventory.host(args.host_id)
    access = host_access(checkout.settings, entry)
    connector = make_connector(checkout.settings, TrustMode.STRICT, connect_timeout=args.timeout)
    endpoint, presented = connector.presented_key(access)
    connector.store.replace(entry.id, *endpoint.known_host, presented, args.fingerprint)
    with connector.connect(access) as connection:
        print(f"trusted {entry.id} ({endpoint.address}) key {connection.fingerprint} in {connector.store.path}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser("check-access", help="one strict SSH connection per physical host")
    add_selection(check)
    check.add_argument("--timeout", type=seconds, default=10.0, help="connect and command timeout (s, default 10)")
    check.set_defaults(func=check_access)
    replace = sub.add_parser("trust", help="replace a host's key after verifying it out of band")
    replace.add_argument("--host", dest="host_id", required=True, metavar="ID", help="the inventory host id")
    replace.add_argument("--fingerprint", required=True, metavar="SHA256:...",
                         help="the new key's fingerprint, verified out of band")  # fmt: skip
    replace.add_argument("--timeout", type=seconds, default=10.0, help="connect timeout (s, default 10)")
    replace.set_defaults(func=trust)

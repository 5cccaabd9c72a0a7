"""`deploy-hosts lease [--host ID ... | --role ROLE ...] [--release [--force]]`: each host's deploy lease.

Every install, rollback and prune holds a lease on each host it changes (`~/Narwhal-deploy/.lease`,
workflows/lease.py). `lease` shows, per selected host (default: every host), what is there: free, held (by
whom, for what, until when), expired, or stuck (a record that is not a lease: what it is and why deploys
refuse it). `--release` removes a lease only where its holder is proven gone (its process on this
workstation ended) or it expired, and names the live holders it left; `--release --force` removes whatever is
there (a stuck record included; never following a link) and an earlier version's fleet lock.
"""

from __future__ import annotations

import argparse
import sys
import time

from narwhal_assets.cli.selection import add_selection
from narwhal_assets.core.errors import InputError

EXIT_FAILED = 1


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.defs.resources import SshSettings
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.trust import TrustMode
    from narwhal_assets.workflows.lease import read_leases, release_leases

    if args.force and not args.release:
        raise InputError(["--force: only with --release"])
    checkout = Checkout.open(args.root)
    entries = checkout.select(args.host or (), args.role or ())
    connector = SshSettings().connector(checkout.settings, TrustMode.STRICT)
    if args.release:
        reports = release_leases(connector, checkout.settings, entries, force=args.force)
    else:
        reports = read_leases(connector, checkout.settings, entries)
    failed = False
    for entry, report in zip(entries, reports, strict=True):
        if isinstance(report, str):
            print(f"deploy-hosts lease: {report}", file=sys.stderr)
            failed = True
            continue
        now = report.now or time.time()
        if args.release and report.outcome == "failed":
            print(f"  {entry.id:<10} kept: {report.explain(now)} ({report.message})")
            failed = True
        elif args.release:
            what = f"cleared {', '.join(report.cleared)}" if args.force and report.cleared else (
                "released" if report.released else "free")  # fmt: skip
            print(f"  {entry.id:<10} {what}")
        else:
            old = "; an earlier version's fleet lock is here (--release --force removes it)" if report.old_fleet_lock \
                else ""  # fmt: skip
            print(f"  {entry.id:<10} {report.explain(now)}{old}")
            failed = failed or report.state == "broken"
    return EXIT_FAILED if failed else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("lease", aliases=["lock"], description=__doc__,
                            help="each host's deploy lease: who holds it; --release it")
    add_selection(parser)
    parser.add_argument("--release", action="store_true",
                        help="remove leases whose holder is gone or whose lease expired (a live one is kept, named)")
    parser.add_argument("--force", action="store_true",
                        help="with --release: remove whatever is there, a live or stuck lease included")
    parser.set_defaults(func=run)

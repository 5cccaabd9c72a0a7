"""`deploy-hosts lock [--release [--force]]`: who holds the fleet deploy lock, and releasing it.

The lock lives on the first inventory host (`~/Narwhal-deploy/.fleet-lock/`, workflows/fleet_lock.py).
`--release` removes it when this user on this workstation holds it (a deploy that was killed); someone
else's needs `--force`. A lease that stopped being refreshed is taken over by the next deploy anyway.
"""

from __future__ import annotations

import argparse

from narwhal_assets.core.errors import InputError

EXIT_FAILED = 1


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.defs.resources import SshSettings
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.trust import TrustMode
    from narwhal_assets.workflows.fleet_lock import FleetLockError, holder_is_me, lock_host, release_lock, show_lock

    if args.force and not args.release:
        raise InputError(["--force: only with --release"])
    checkout = Checkout.open(args.root)
    connector = SshSettings().connector(checkout.settings, TrustMode.STRICT)
    where = lock_host(checkout.inventory).id
    report = show_lock(connector, checkout.settings, checkout.inventory)
    if report.outcome == "failed":
        raise FleetLockError(f"host {where}: fleet lock: {report.message}")
    if report.holder is None:
        print(f"the fleet lock (on host {where}) is free")
        return 0
    lease = "its lease ran out: the next deploy takes it over" if report.stale else "held"
    print(f"the fleet lock (on host {where}) is {lease}: {report.holder.describe(report.now)}")
    if not args.release:
        return 0
    if not holder_is_me(report.holder) and not args.force:
        raise InputError([f"--release: the fleet lock is someone else's ({report.holder.user}@"
                          f"{report.holder.workstation}); add --force to break it"])  # fmt: skip
    released = release_lock(connector, checkout.settings, checkout.inventory, force=True)
    if released.outcome != "released":
        raise FleetLockError(f"host {where}: fleet lock: {released.message}")
    print(f"released the fleet lock of {report.holder.user}@{report.holder.workstation}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("lock", help="who holds the fleet deploy lock; --release it", description=__doc__)
    parser.add_argument("--release", action="store_true", help="release it (yours; someone else's with --force)")
    parser.add_argument("--force", action="store_true", help="with --release: break someone else's lock")
    parser.set_defaults(func=run)

"""`deploy-hosts status`: which deployment each host runs (read-only; rollback: cli/install.py, prune: cli/prune.py).

`status` reads every selected host over one strict connection (read-only), records each host's live
deployment as an observation of its `host_installation` partition and the drift check's evaluation, then
prints a table (or `--json`); exit 1 when a host could not be read, something is tampered or drifting.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal_assets.cli.selection import add_selection

if TYPE_CHECKING:  # Dagster and paramiko load only when the command runs (fast --help)
    from dagster import DagsterInstance

    from narwhal_assets.workflows.status import HostStatus

EXIT_FAILED = 1


def run(args: argparse.Namespace) -> int:
    """Check the input before Dagster is imported or the instance touched (bad input answers at once), then
    read the hosts in a forked child while this process loads Dagster and opens the instance, then record
    what they run. (Importing Dagster in a thread instead was measured: it competes with the SSH handshakes
    for the interpreter and gained nothing.)"""
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.local.forked import forked

    checkout = Checkout.open(args.root)
    entries = checkout.select(args.host or (), args.role or ())
    # After the input is checked; loaded here, not in the child, because this process unpickles its result.
    from narwhal_assets.workflows.status import read_hosts

    with forked(lambda: read_hosts(checkout, entries)) as hosts:
        instance, record_statuses = _status_instance(args.root, checkout.inventory.host_ids())
        statuses, _ = hosts.join()
    drifted, interrupted, evaluation = record_statuses(instance, statuses)
    selected = {s.host_id for s in statuses}
    problems = [p for s in statuses for p in s.problems()]
    drift = f"runs another deployment than the one last installed there (check {evaluation.check_name})"
    problems += [f"host {h}: {interrupted.get(h, drift)}" for h in drifted if h in selected]
    if args.json:
        print(json.dumps({"hosts": [s.as_json() for s in statuses], "drifting": drifted, "interrupted": interrupted,
                          "check": {"name": evaluation.check_name, "passed": evaluation.passed}}))  # fmt: skip
    else:
        _print_table(statuses)
    for problem in problems:
        print(f"deploy-hosts status: {problem}", file=sys.stderr)
    return EXIT_FAILED if problems else 0


def _status_instance(root: Path, host_ids: list[str]) -> tuple[DagsterInstance, Callable[..., Any]]:
    """The instance with every host's partition, and the function that records statuses in it (Dagster is
    imported here, after the input was checked)."""
    from narwhal_assets.cli.install import instance_with_hosts
    from narwhal_assets.defs.installation.status import record_statuses

    return instance_with_hosts(root, host_ids), record_statuses


def _print_table(statuses: list[HostStatus]) -> None:
    from narwhal_assets.workflows.status import short

    print(f"{'HOST':<10} {'ROLES':<18} {'CURRENT':<12} {'REVISION':<12} {'STATE':<10} {'CHECK':<9} DIRECTORIES")
    for s in statuses:
        if s.error is not None:
            print(f"{s.host_id:<10} {','.join(s.roles):<18} unreachable: {s.error}")
            continue
        live = s.live
        revision = live.revision if live else None
        print(f"{s.host_id:<10} {','.join(s.roles):<18} {short(s.current):<12} {short(revision):<12} "
              f"{(live.state if live else 'none'):<10} {(live.check if live else '-'):<9} {len(s.deployments)}")
        for d in s.deployments:
            mark = " (current)" if d.name == s.current else ""
            print(f"  {d.name:<32} {d.state:<10} {d.check:<9} revision {short(d.revision)}{mark}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("status", help="which deployment each selected host runs (read-only)",
                            description=__doc__)  # fmt: skip
    add_selection(parser)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    parser.set_defaults(func=run)

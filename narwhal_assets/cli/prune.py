"""`deploy-hosts prune`: removing old deployments on hosts and unused prepared runs.

`prune [--keep N]` (default 5; under each host's lease) removes old deployment directories on hosts (never
`current`, never a locked one) and prepared runs on this workstation that no host holds any more; `--dry-run`
only lists them.
"""

from __future__ import annotations

import argparse
import sys

from narwhal_assets.cli.selection import add_selection

EXIT_FAILED = 1
DEFAULT_KEEP = 5  # prune's retention when --keep is not given (README)


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.workflows.prune import prune

    result = prune(args.root, args.host or (), args.role or (), args.keep, dry_run=args.dry_run, say=print)
    if args.dry_run:
        print("dry run: nothing was removed")
    for problem in result.problems:
        print(f"deploy-hosts prune: {problem}", file=sys.stderr)
    return EXIT_FAILED if result.problems else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("prune", help="remove old deployment directories on hosts and unused prepared runs",
                            description=__doc__)  # fmt: skip
    parser.add_argument("--keep", type=int, default=DEFAULT_KEEP, metavar="N", help="deployments kept per host "
                        "(current included) and newest prepared runs kept on this workstation (default "
                        f"{DEFAULT_KEEP}: the current one and four to roll back to)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed; change nothing")
    add_selection(parser)
    parser.set_defaults(func=run)

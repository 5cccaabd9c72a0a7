"""`deploy-hosts`: the operator's command line. Artifact-producing commands materialize the same assets."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from narwhal_assets.commands import access, discover, install, interactive, plan, prepare
from narwhal_assets.core.errors import InputError, NarwhalError

EXIT_FAILED = 1
EXIT_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deploy-hosts", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="management checkout (default: current directory)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (plan, discover, prepare, access, install, interactive):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = (args.root or Path.cwd()).resolve()
    try:
        return int(args.func(args))
    except NarwhalError as exc:
        for line in str(exc).splitlines():
            print(f"deploy-hosts {args.command}: error: {line}", file=sys.stderr)
        return EXIT_INPUT if isinstance(exc, InputError) else EXIT_FAILED

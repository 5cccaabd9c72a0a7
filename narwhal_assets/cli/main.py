"""`deploy-hosts`: the operator's command line. Artifact-producing commands run the same Dagster jobs as the UI."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from narwhal_assets.cli import (
    access,
    discover,
    install,
    lease,
    plan,
    preload,
    prepare,
    prune,
    resolve,
    shell,
    status,
    tunnel,
    ui,
)
from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.local import collector
from narwhal_assets.local.process_env import make_process_private

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports SIGINT, and as a command run by the runner ends on one
ROOT_HELP = "management checkout (default: the current directory)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deploy-hosts", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help=ROOT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (plan, discover, prepare, access, resolve, install, status, prune, lease, shell, tunnel, ui, preload):
        module.register(sub)
    # `deploy-hosts plan --root X` works as well as `--root X plan`; an alias names the same parser (once here)
    for command in dict.fromkeys(sub.choices.values()):
        command.add_argument("--root", type=Path, default=argparse.SUPPRESS, help=ROOT_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.root = (args.root or Path.cwd()).resolve()
    make_process_private(args.root)  # before anything is created or started
    try:
        with collector.paused_while_loading():
            return int(args.func(args))
    except NarwhalError as exc:
        for line in str(exc).split("\n"):  # our lines; anything a host put inside one is escaped
            print(f"deploy-hosts {args.command}: error: {printable(line, None)}", file=sys.stderr)
        return EXIT_INPUT if isinstance(exc, InputError) else EXIT_FAILED
    except KeyboardInterrupt:  # a command outside the runner (check-access, trust, ...): one line, no traceback
        print(f"deploy-hosts {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def command() -> int:
    """`main` in a process that ends with it: the executable's own (`cli/entry.py`) or a preloaded child."""
    try:
        return main()
    finally:
        collector.exiting()

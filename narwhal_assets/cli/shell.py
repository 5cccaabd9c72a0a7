"""`deploy-hosts shell --role ROLE [--run DIR | --current] [--command CMD]`: OpenSSH to the host owning a role.

Without `--run` or `--current` a login shell; with one of them, the role shell of that deployment (its
checkout, only this role's environment, its `.venv`), or `--command` run there without a TTY. OpenSSH is
exec'd: the terminal, signals and exit status are its own (workflows/shell.py builds the command).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from narwhal_assets.core.prepared_run.manifest import REMOTE_BASE


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.openssh_process import exec_openssh
    from narwhal_assets.workflows.shell import role_host_openssh

    checkout = Checkout.open(args.root)
    exec_openssh(role_host_openssh(checkout, args.role, run=args.run, current=args.current, command=args.run_command))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sh = sub.add_parser("shell", help="interactive shell on the host owning --role (with --run or --current: in "
                        "its role environment)")  # fmt: skip
    sh.add_argument("--role", required=True, metavar="ROLE", help="router or engine-<n>: the host owning it")
    which = sh.add_mutually_exclusive_group()
    which.add_argument("--run", type=Path, metavar="DIR", help="a prepared and installed run: enter its checkout, "
                       "load runs/deployment/.env.ROLE (tracing off), activate .venv")  # fmt: skip
    which.add_argument("--current", action="store_true", help=f"the same in the deployment ~/{REMOTE_BASE}/current "
                       "points at (the one in service), without naming its prepared run")  # fmt: skip
    sh.add_argument("--command", dest="run_command", metavar="CMD", help="with --run or --current: run CMD in "
                    "that environment without a TTY instead of an interactive bash")  # fmt: skip
    sh.set_defaults(func=run)

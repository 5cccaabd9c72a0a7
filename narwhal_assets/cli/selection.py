"""`deploy-hosts` subcommands; each is a thin layer over the core, the adapters and the jobs.

Modules here import Dagster and paramiko only inside the functions that need them, so `--help` and
`plan` start fast.
"""

from __future__ import annotations

import argparse


def add_selection(parser: argparse.ArgumentParser) -> None:
    """`--host` / `--role`, repeatable and mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--host", action="append", metavar="ID", help="physical host id (repeatable)")
    group.add_argument("--role", action="append", metavar="ROLE", help="the host owning this role (repeatable)")

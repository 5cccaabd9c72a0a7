"""`--host` / `--role`: which hosts a command acts on, spelled the same by every command that selects hosts."""

from __future__ import annotations

import argparse


def add_selection(parser: argparse.ArgumentParser) -> None:
    """`--host` / `--role`, repeatable and mutually exclusive; neither: every host in the inventory."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--host", action="append", metavar="ID", help="physical host id (repeatable)")
    which.add_argument("--role", action="append", metavar="ROLE",
                       help="the host owning ROLE, colocated roles included (repeatable)")  # fmt: skip

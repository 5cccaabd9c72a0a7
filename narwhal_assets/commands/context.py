"""What every subcommand starts from: the checkout's settings and its validated inventory."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from narwhal_assets.core.inventory import HostEntry, Inventory
from narwhal_assets.core.settings import Settings
from narwhal_assets.inventory_file import current_inventory
from narwhal_assets.ssh.access import select_hosts


@dataclass(frozen=True)
class Checkout:
    root: Path
    settings: Settings
    inventory: Inventory

    @classmethod
    def open(cls, root: Path) -> Checkout:
        settings = Settings.load(root)
        return cls(root, settings, current_inventory(settings))

    def selected(self, args: argparse.Namespace) -> list[HostEntry]:
        return select_hosts(self.inventory, getattr(args, "host", None) or (), getattr(args, "role", None) or ())


def add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", action="append", metavar="ID", help="physical host id (repeatable)")
    parser.add_argument("--role", action="append", metavar="ROLE", help="host owning this role (repeatable)")

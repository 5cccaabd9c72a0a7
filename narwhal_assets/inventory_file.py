"""Resolve the inventory every command uses: the `NARWHAL_HOSTS` file if present, else derived from .env."""

from __future__ import annotations

from narwhal_assets.core.inventory import Inventory, derive_inventory, load_inventory, validate_inventory
from narwhal_assets.core.settings import Settings
from narwhal_assets.privatefiles import write_private


def current_inventory(settings: Settings) -> Inventory:
    """Load and validate the saved inventory; if none is saved yet, derive one from the destinations."""
    path = settings.hosts_path
    if path.exists():
        inventory = load_inventory(path)
        source = str(path)
    else:
        inventory = derive_inventory(settings)
        source = f"{settings.root / '.env'} (derived inventory)"
    validate_inventory(inventory, settings, source)
    return inventory


def save_inventory(settings: Settings, inventory: Inventory) -> str:
    """Write the inventory file (0600, atomic); returns its SHA-256."""
    return write_private(settings.hosts_path, inventory.to_json())

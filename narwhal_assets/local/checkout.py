"""The management checkout: its settings and validated inventory, opened the same way by the CLI and by Dagster.

Opening a checkout first completes (or rolls back) a config-set publish that a crash interrupted, so no
command ever reads a half-replaced set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from narwhal_assets.core.errors import InputError, Problems
from narwhal_assets.core.inputs.inventory import (
    HostEntry,
    Inventory,
    derive_inventory,
    load_inventory,
    validate_inventory,
)
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import MANIFEST_FILE
from narwhal_assets.local.configset import recover_publish
from narwhal_assets.local.privatefiles import write_private


@dataclass(frozen=True)
class Checkout:
    """Settings plus the inventory every command and asset works from."""

    settings: Settings
    inventory: Inventory
    inventory_saved: bool

    @classmethod
    def open(cls, root: Path) -> Checkout:
        """Load `.env` and `config/deployment.env`, then the saved inventory (or derive it from `.env`)."""
        settings = Settings.load(root)
        if recover_publish(settings):
            settings = Settings.load(root)
        return cls.from_settings(settings)

    @classmethod
    def from_settings(cls, settings: Settings) -> Checkout:
        """The checkout as these settings see it: the saved inventory, or one derived from the destinations."""
        path = settings.hosts_path
        saved = path.exists()
        if saved:
            inventory, source = load_inventory(path), str(path)
        else:
            inventory, source = derive_inventory(settings), f"{settings.root / '.env'} (derived inventory)"
        validate_inventory(inventory, settings, source)
        return cls(settings, inventory, saved)

    @property
    def root(self) -> Path:
        return self.settings.root

    def select(self, host_ids: Sequence[str] = (), roles: Sequence[str] = ()) -> list[HostEntry]:
        """Hosts named by `--host` or owning a `--role` (colocated roles come along), in inventory order; all
        when none given. Every unknown id and role is reported at once."""
        if not host_ids and not roles:
            return list(self.inventory.hosts)
        wanted: set[str] = set()
        problems = Problems()
        inventory = self.inventory
        known_roles = f" (known: {', '.join(inventory.roles())})"  # as `--host` lists the host ids
        for flag, names, lookup, known in (("--host", host_ids, inventory.host, ""),
                                           ("--role", roles, inventory.host_for_role, known_roles)):  # fmt: skip
            for name in names:
                try:
                    wanted.add(lookup(name).id)
                except InputError as exc:
                    problems += [f"{flag} {name}: {problem}{known}" for problem in exc.problems]
        problems.raise_if_any()
        return [entry for entry in self.inventory.hosts if entry.id in wanted]

    def save_inventory(self) -> str:
        """Write the inventory file (0600, atomic); returns its SHA-256."""
        return write_private(self.settings.hosts_path, self.inventory.to_json())


SHOWN_RUNS = 10


def prepared_run_names(settings: Settings) -> list[str]:
    """Directories under `runs/deployment-env/` (NARWHAL_DEPLOYMENT_ENV_DIR) holding a `manifest.json`, oldest
    first by that file's time (`prepare` writes it last, so a directory without one never finished)."""
    found = []
    try:
        entries = list(settings.deployment_env_dir.iterdir())
    except OSError:  # no run prepared yet (or the directory is unreadable): nothing to offer
        return []
    for entry in entries:
        try:
            found.append(((entry / MANIFEST_FILE).stat().st_mtime_ns, entry.name))
        except OSError:
            continue
    return [name for _, name in sorted(found)]


def missing_run_problem(settings: Settings, run_dir: Path) -> str:
    """The line for a `--run DIR` that is not a directory: that, and the prepared runs there are to choose from."""
    state = "is not a directory" if run_dir.exists() else "does not exist"
    names = prepared_run_names(settings)
    shown = ", ".join(names[-SHOWN_RUNS:]) if names else "none yet (`deploy-hosts prepare` makes one)"
    more = f"the newest {SHOWN_RUNS} of {len(names)}, " if len(names) > SHOWN_RUNS else ""
    return f"--run {run_dir}: {state}; prepared runs in {settings.deployment_env_dir} ({more}oldest first): {shown}"

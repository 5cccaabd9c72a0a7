"""Dagster resources: thin configurable wrappers over the plain settings and adapters."""

import os
from pathlib import Path

import dagster as dg

from narwhal_assets.core.settings import Settings

ROOT_ENV = "NARWHAL_ROOT"


def default_root() -> str:
    """The management checkout: `NARWHAL_ROOT` when set, else the current directory."""
    return os.environ.get(ROOT_ENV) or os.getcwd()


class NarwhalSettings(dg.ConfigurableResource):
    """Where the management checkout is; settings are read fresh for every run."""

    root: str = ""

    def load(self) -> Settings:
        return Settings.load(Path(self.root or default_root()))


class SshSettings(dg.ConfigurableResource):
    """Timeouts for the paramiko transport; trust store and ssh config come from the checkout settings."""

    connect_timeout_s: float = 10.0
    command_timeout_s: float = 600.0

"""Dagster resources: thin configurable wrappers over the management checkout and the SSH adapter."""

import os
from pathlib import Path

import dagster as dg

from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import make_connector
from narwhal_assets.ssh.transport import DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, Connector
from narwhal_assets.ssh.trust import TrustMode

ROOT_ENV = "NARWHAL_ROOT"


def default_root() -> str:
    """The management checkout: `NARWHAL_ROOT` when set, else the current directory."""
    return os.environ.get(ROOT_ENV) or os.getcwd()


class ManagementCheckout(dg.ConfigurableResource):  # type: ignore[type-arg]  # Dagster's form: the bare class
    """Where the management checkout is; it is opened fresh (settings, inventory) for every run."""

    root: str = ""

    @property
    def path(self) -> Path:
        return Path(self.root or default_root())

    def open(self) -> Checkout:
        return Checkout.open(self.path)


class SshSettings(dg.ConfigurableResource):  # type: ignore[type-arg]  # Dagster's form: the bare class
    """The paramiko transport as a resource: timeouts here, trust store and ssh config from the checkout."""

    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT

    def connector(self, settings: Settings, mode: TrustMode, *, staged: bool = False) -> Connector:
        return make_connector(settings, mode, self.connect_timeout_s, self.command_timeout_s, staged=staged)

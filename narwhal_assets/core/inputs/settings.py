"""Layered settings: built-in defaults < config/deployment.env < .env < process environment.

The management checkout is the current directory (or `--root`); every relative path resolves against it.
Each value remembers the layer it came from, so generated files can record their sources.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from narwhal_assets.core import limits
from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.envfile import load_env_file

DOTENV = ".env"
DEPLOYMENT_ENV = "config/deployment.env"
PROFILING_LIMITS_FILE = "profiling-limits.json"

PATH_DEFAULTS = {
    "NARWHAL_HOSTS": "config/hosts.local.json",
    "NARWHAL_SSH_KNOWN_HOSTS": "config/ssh.known_hosts",
    "NARWHAL_FLEET": "config/fleet.json",
    "NARWHAL_LAUNCH_CONFIG": "config/engine-launch.local.json",
    "NARWHAL_LAUNCH_SOURCES": "config/engine-launch.sources.json",
    "NARWHAL_DISCOVERY_DIR": "runs/discovery",
    "NARWHAL_DEPLOYMENT_ENV_DIR": "runs/deployment-env",
}


class Layer(StrEnum):
    """Where a value came from, lowest precedence first."""

    DEFAULT = "default"
    DISCOVERED = "discovered"
    DOTENV = "dotenv"
    PROCESS = "process"


@dataclass(frozen=True)
class Settings:
    """Every variable visible to the deployment tools, with its layer."""

    root: Path
    layers: tuple[tuple[Layer, Mapping[str, str]], ...] = field(default_factory=tuple)

    @classmethod
    def load(
        cls,
        root: Path | str,
        environ: Mapping[str, str] | None = None,
        defaults: Mapping[str, str] | None = None,
    ) -> Settings:
        """Read `config/deployment.env` and `.env` under `root`, then overlay `environ` (os.environ).

        Dagster's CLI and webserver copy a `.env` in their working directory into the process environment,
        so a process value equal to the `.env` value is attributed to `.env`: recorded sources must not
        depend on whether `deploy-hosts` or `dagster` ran the assets. Files and `NARWHAL_*` process values
        are held to `core/limits.py`.
        """
        root = Path(root).resolve()
        problems: list[str] = []
        discovered, dotenv = (_load_collecting(root / name, problems) for name in (DEPLOYMENT_ENV, DOTENV))
        process = dict(os.environ if environ is None else environ)
        problems += _process_problems(process)
        raise_if(problems)
        return cls(
            root=root,
            layers=(
                (Layer.DEFAULT, dict(defaults or {})),
                (Layer.DISCOVERED, discovered),
                (Layer.DOTENV, dotenv),
                (Layer.PROCESS, {name: v for name, v in process.items() if dotenv.get(name) != v}),
            ),
        )

    def lookup(self, name: str) -> tuple[str, Layer] | None:
        """The winning value of `name` and its layer, or None when no layer sets it."""
        for layer, values in reversed(self.layers):
            if name in values:
                return values[name], layer
        return None

    def get(self, name: str, default: str | None = None) -> str | None:
        found = self.lookup(name)
        return default if found is None else found[0]

    def names(self) -> set[str]:
        return {name for _, values in self.layers for name in values}

    def path(self, name: str) -> Path:
        """A path variable from PATH_DEFAULTS (empty means default), resolved against the checkout.

        Values are literal, as bash would see them after sourcing `.env`: a quoted `~` is not expanded.
        """
        value = self.get(name) or PATH_DEFAULTS[name]
        return (self.root / value).resolve()

    @property
    def hosts_path(self) -> Path:
        return self.path("NARWHAL_HOSTS")

    @property
    def known_hosts_path(self) -> Path:
        return self.path("NARWHAL_SSH_KNOWN_HOSTS")

    @property
    def fleet_path(self) -> Path:
        return self.path("NARWHAL_FLEET")

    @property
    def launch_config_path(self) -> Path:
        return self.path("NARWHAL_LAUNCH_CONFIG")

    @property
    def launch_sources_path(self) -> Path:
        return self.path("NARWHAL_LAUNCH_SOURCES")

    @property
    def deployment_env_path(self) -> Path:
        """The discovered layer; fixed, because it is read before any other setting."""
        return self.root / DEPLOYMENT_ENV

    @property
    def profiling_limits_path(self) -> Path:
        """`profiling-limits.json` beside the fleet file: the router reads both from one directory."""
        return self.fleet_path.parent / PROFILING_LIMITS_FILE

    @property
    def discovery_dir(self) -> Path:
        return self.path("NARWHAL_DISCOVERY_DIR")

    @property
    def deployment_env_dir(self) -> Path:
        """Where `prepare` puts each deployment's output directory by default (git-ignored)."""
        return self.path("NARWHAL_DEPLOYMENT_ENV_DIR")

    @property
    def ssh_config_path(self) -> Path | None:
        """The operator's OpenSSH client config: `NARWHAL_SSH_CONFIG`, which must then be a file (every host
        would otherwise fail name resolution for a typo), else ~/.ssh/config if present."""
        value = self.get("NARWHAL_SSH_CONFIG")
        if not value:
            default = Path("~/.ssh/config").expanduser()
            return default if default.is_file() else None
        path = Path(value) if Path(value).is_absolute() else self.root / value
        if not path.is_file():
            state = "is a directory" if path.is_dir() else "does not exist" if not path.exists() else "is not a file"
            raise InputError([f"NARWHAL_SSH_CONFIG: {path} {state}; name an OpenSSH client config file"])
        return path


def _process_problems(process: Mapping[str, str]) -> list[str]:
    """Over-long `NARWHAL_*` values of the process environment (other variables are not this project's)."""
    found = (limits.too_long(name, value) for name, value in sorted(process.items()) if name.startswith(limits.PREFIX))
    return [f"process environment: {problem}" for problem in found if problem]


def _load_collecting(path: Path, problems: list[str]) -> dict[str, str]:
    """One assignment file; its problems join `problems` so both files' mistakes are reported at once."""
    try:
        return load_env_file(path)
    except InputError as exc:
        problems += exc.problems
        return {}

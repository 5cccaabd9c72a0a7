"""Management access that reached a process environment, removed before anything can pass it on.

`.env` is data: `deploy-hosts` reads it and never exports it. Dagster's own commands (`dagster dev`,
`dagster-webserver`, `dg`) copy a `.env` in their working directory into their environment, and every code
server and run worker they start inherits it, so a password or destination would sit in
`/proc/<pid>/environ` of each. Every entry point (the command line, the code location as Dagster loads it)
calls `make_process_private` first: what the process creates is private, and `scrub_access_variables`
removes a `..._SSH_PASSWORD` variable, or any variable holding a destination the checkout's `.env` defines
(settings read `.env` itself), telling the operator which names were removed, never a value.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping
from pathlib import Path

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.envfile import load_env_file
from narwhal_assets.core.inputs.inventory import destination_role
from narwhal_assets.core.inputs.settings import DOTENV
from narwhal_assets.core.roles import PASSWORD_SUFFIX

PASSWORD_ENDING = "_SSH" + PASSWORD_SUFFIX


class AccessInEnvironmentWarning(UserWarning):
    """A password or destination was found in (and removed from) the process environment."""


def access_variables(environ: MutableMapping[str, str], root: Path) -> list[str]:
    """Names in `environ` that hold management access: every `..._SSH_PASSWORD`, and every variable whose
    value is one of the destinations `<root>/.env` defines (a `.env` that does not parse defines none here;
    the run that reads it reports why)."""
    try:
        dotenv = load_env_file(root / DOTENV)
    except InputError:
        dotenv = {}
    destinations = {value for name, value in dotenv.items() if value and destination_role(name) is not None}
    return sorted(name for name, value in environ.items()
                  if name.endswith(PASSWORD_ENDING) or (value and value in destinations))  # fmt: skip


def scrub_access_variables(environ: MutableMapping[str, str], root: Path) -> list[str]:
    """Remove `access_variables` from `environ` and warn once naming them; returns the removed names."""
    removed = access_variables(environ, root)
    for name in removed:
        del environ[name]
    if removed:
        warnings.warn(
            f"removed {', '.join(removed)} from this process's environment: management passwords and destinations "
            f"are read from {root / DOTENV}, never inherited (start Dagster with `deploy-hosts ui`, or from a "
            "directory without a .env)",
            AccessInEnvironmentWarning,
            stacklevel=2,
        )
    return removed


def make_process_private(root: Path) -> None:
    """What every entry point does before anything else: files it and its children create are private
    (umask 077, Dagster's storage included), and no management access is left in its environment."""
    os.umask(0o077)
    scrub_access_variables(os.environ, root)

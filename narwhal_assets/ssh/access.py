"""From inventory entries to `HostAccess` records and configured connectors: one place for both."""

from __future__ import annotations

import math
from collections.abc import Sequence

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.ssh.openssh import MAX_PASSWORD_BYTES
from narwhal_assets.ssh.transport import (
    DEFAULT_ALIVE_COUNT,
    DEFAULT_ALIVE_INTERVAL,
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HOST_TIMEOUT,
    Connector,
    HostAccess,
)
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode

# Operator-tunable transport bounds: variable -> (default, smallest, largest). Seconds, except the count.
ALIVE_INTERVAL_ENV = "NARWHAL_SSH_ALIVE_INTERVAL"
ALIVE_COUNT_ENV = "NARWHAL_SSH_ALIVE_COUNT"
HOST_TIMEOUT_ENV = "NARWHAL_SSH_HOST_TIMEOUT"
BOUNDS: dict[str, tuple[float, float, float]] = {
    ALIVE_INTERVAL_ENV: (DEFAULT_ALIVE_INTERVAL, 0.5, 300.0),
    ALIVE_COUNT_ENV: (DEFAULT_ALIVE_COUNT, 1, 100),
    HOST_TIMEOUT_ENV: (DEFAULT_HOST_TIMEOUT, 1.0, 86400.0),
}


def host_access(settings: Settings, entry: HostEntry) -> HostAccess:
    """The destination and (when `password_env` is set) password of one host, read from the settings."""
    problems = []
    destination = settings.get(entry.ssh_env)
    if not destination:
        problems.append(f"host {entry.id}: {entry.ssh_env} is unset or empty")
    password = settings.get(entry.password_env) if entry.password_env else None
    if entry.password_env and not password:
        problems.append(f"host {entry.id}: {entry.password_env} is unset or empty (password authentication)")
    if entry.password_env and password and (len(password.encode()) > MAX_PASSWORD_BYTES or "\n" in password):
        problems.append(
            f"host {entry.id}: {entry.password_env} must be one line of at most {MAX_PASSWORD_BYTES} bytes "
            "(OpenSSH reads no more)"
        )
    raise_if(problems)
    assert destination is not None
    return HostAccess(entry.id, entry.ssh_env, destination, password)


def host_accesses(settings: Settings, entries: Sequence[HostEntry]) -> list[HostAccess]:
    accesses, problems = [], []
    for entry in entries:
        try:
            accesses.append(host_access(settings, entry))
        except InputError as exc:
            problems += exc.problems
    raise_if(problems)
    return accesses


def make_connector(
    settings: Settings,
    mode: TrustMode,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    *,
    staged: bool = False,
) -> Connector:
    """A connector bound to this checkout's trust store, the operator's ssh config and transport bounds.

    `staged` keeps accept-new enrolments in memory until `connector.store.commit()`.
    """
    bounds = transport_bounds(settings)
    return Connector(
        store=KnownHostsStore(settings.known_hosts_path, staged=staged),
        mode=mode,
        ssh_config=settings.ssh_config_path,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
        host_timeout=bounds[HOST_TIMEOUT_ENV],
        alive_interval=bounds[ALIVE_INTERVAL_ENV],
        alive_count=int(bounds[ALIVE_COUNT_ENV]),
    )


def transport_bounds(settings: Settings) -> dict[str, float]:
    """The keep-alive and host-timeout settings, each checked against its documented range."""
    values, problems = {}, []
    for name, (default, low, high) in BOUNDS.items():
        text = (settings.get(name) or "").strip()
        try:
            value = float(text or default)
        except ValueError:
            value = math.nan
        integral = name != ALIVE_COUNT_ENV or value.is_integer()
        if not (low <= value <= high and integral):
            kind = "an integer" if name == ALIVE_COUNT_ENV else "a number of seconds"
            problems.append(f"{name}: must be {kind} from {low:g} to {high:g}")
        values[name] = value
    raise_if(problems)
    return values

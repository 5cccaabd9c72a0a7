"""From inventory entries to `HostAccess` records and configured connectors: one place for both."""

from __future__ import annotations

from collections.abc import Sequence

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inventory import HostEntry, Inventory
from narwhal_assets.core.settings import Settings
from narwhal_assets.ssh.transport import DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, Connector, HostAccess
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode


def select_hosts(inventory: Inventory, host_ids: Sequence[str] = (), roles: Sequence[str] = ()) -> list[HostEntry]:
    """Hosts named by `--host` or owning a `--role` (colocated roles come along), in inventory order; all when
    none given. Every unknown id and role is reported at once."""
    if not host_ids and not roles:
        return list(inventory.hosts)
    wanted: set[str] = set()
    problems: list[str] = []
    for flag, names, lookup in (("--host", host_ids, inventory.host), ("--role", roles, inventory.host_for_role)):
        for name in names:
            try:
                wanted.add(lookup(name).id)
            except InputError as exc:
                problems += [f"{flag} {name}: {problem}" for problem in exc.problems]
    raise_if(problems)
    return [entry for entry in inventory.hosts if entry.id in wanted]


def host_access(settings: Settings, entry: HostEntry) -> HostAccess:
    """The destination and (when `password_env` is set) password of one host, read from the settings."""
    problems = []
    destination = settings.get(entry.ssh_env)
    if not destination:
        problems.append(f"host {entry.id}: {entry.ssh_env} is unset or empty")
    password = settings.get(entry.password_env) if entry.password_env else None
    if entry.password_env and not password:
        problems.append(f"host {entry.id}: {entry.password_env} is unset or empty (password authentication)")
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
    """A connector bound to this checkout's trust store and the operator's ssh config.

    `staged` keeps accept-new enrolments in memory until `connector.store.commit()`.
    """
    return Connector(
        store=KnownHostsStore(settings.known_hosts_path, staged=staged),
        mode=mode,
        ssh_config=settings.ssh_config_path,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
    )

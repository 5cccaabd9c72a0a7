"""The physical-host inventory (`NARWHAL_HOSTS`): which machine owns which roles, and how to reach it.

The inventory names variables only. Destinations and passwords stay in the workstation `.env`.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from narwhal_assets.core import limits
from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.settings import DOTENV, Layer, Settings
from narwhal_assets.core.roles import PASSWORD_SUFFIX, ROUTER, ROUTER_SSH, Role, engine_number, node_variable

HOST_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
# Names that look like a destination variable; those that are not one exactly would be silently ignored.
DESTINATION_LIKE_RE = re.compile(r"NARWHAL_(?:ROUTER|NODE_[^_]*)_SSH")
__all__ = ["PASSWORD_SUFFIX", "ROUTER", "ROUTER_SSH", "HostEntry", "Inventory", "engine_number"]


class HostEntry(BaseModel):
    """One physical machine: its id, the variable holding its destination, and its roles."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    ssh_env: str
    password_env: str | None = None
    roles: list[str] = Field(min_length=1)

    def engine_numbers(self) -> list[int]:
        return sorted(n for n in (engine_number(r) for r in self.roles) if n is not None)

    def role_ssh_envs(self) -> list[str]:
        """The destination variables of this entry's roles: the only names `ssh_env` may hold."""
        return [role.ssh_env for role in sorted({role for role in map(Role.parse, self.roles) if role})]


class Inventory(BaseModel):
    """`config/hosts.local.json`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    schema_: Literal["narwhal.hosts"] = Field(default="narwhal.hosts", alias="schema")
    schema_version: Literal[1] = 1
    hosts: list[HostEntry]

    def host(self, host_id: str) -> HostEntry:
        entry = self._by_id.get(host_id)
        if entry is None:
            raise InputError([f"inventory: no host with id {host_id!r} (known: {', '.join(self.host_ids())})"])
        return entry

    def host_for_role(self, role: str) -> HostEntry:
        entry = self._by_role.get(role)
        if entry is None:
            raise InputError([f"inventory: no host owns role {role!r}"])
        return entry

    @cached_property
    def _by_id(self) -> dict[str, HostEntry]:
        """Host id -> entry (the first, as a scan would find it): callers look hosts up once per host or role."""
        found: dict[str, HostEntry] = {}
        for entry in self.hosts:
            found.setdefault(entry.id, entry)
        return found

    @cached_property
    def _by_role(self) -> dict[str, HostEntry]:
        found: dict[str, HostEntry] = {}
        for entry in self.hosts:
            for role in entry.roles:
                found.setdefault(role, entry)
        return found

    def roles(self) -> list[str]:
        """Every role some host owns: the router first, then engines by number."""
        return sorted({role for entry in self.hosts for role in entry.roles}, key=_role_order)

    def host_ids(self) -> list[str]:
        return [entry.id for entry in self.hosts]

    def engine_numbers(self) -> list[int]:
        return sorted(n for entry in self.hosts for n in entry.engine_numbers())

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2) + "\n"


def destination_role(name: str) -> Role | None:
    """The role whose destination variable `name` is (`NARWHAL_ROUTER_SSH`, `NARWHAL_NODE_<n>_SSH`), else None."""
    if name == ROUTER_SSH:
        return Role.router()
    node = node_variable(name)
    return Role.engine(node[0]) if node and node[1] == "SSH" else None


def destination_variables(settings: Settings) -> dict[str, str]:
    """Role -> the variable naming its destination, for each destination variable with a value."""
    roles: dict[str, str] = {}
    for name in settings.names():
        role = destination_role(name)
        if role and settings.get(name):
            roles[role.name] = name
    return roles


def destination_problems(settings: Settings) -> list[str]:
    """Destination variables that would silently drop a role: set but empty, or not quite the pattern."""
    problems = []
    for name in sorted(n for n in settings.names() if DESTINATION_LIKE_RE.fullmatch(n)):
        value, layer = settings.lookup(name) or ("", Layer.DEFAULT)
        where = {
            Layer.DISCOVERED: str(settings.deployment_env_path),
            Layer.DOTENV: str(settings.root / DOTENV),
            Layer.PROCESS: "process environment",
        }.get(layer, "built-in defaults")
        if destination_role(name) is None:
            problems.append(
                f"{where}: {name} is not a destination variable (NARWHAL_ROUTER_SSH or NARWHAL_NODE_<n>_SSH, "
                "n in 1..999999 without leading zeros); rename or remove it"
            )
        elif not value:
            problems.append(
                f"{where}: {name} is set but empty, which would drop role {destination_role(name)}; "
                "give it a destination or remove it"
            )
    return problems


def derive_inventory(settings: Settings) -> Inventory:
    """Group roles whose destination values are identical into one physical-host record.

    The router shares the lowest-numbered engine's host when `NARWHAL_ROUTER_SSH` is unset. Ids are
    `node-<n>` after the lowest engine number on the host, or `router` for a router-only host.
    """
    raise_if(destination_problems(settings))
    role_vars = destination_variables(settings)
    engines = sorted(n for n in map(engine_number, role_vars) if n is not None)
    if not engines:
        raise InputError([_no_destination(settings.root)])
    groups: dict[str, list[str]] = {}
    for role in sorted(role_vars, key=_role_order):
        groups.setdefault(settings.get(role_vars[role]) or "", []).append(role)
    if ROUTER not in role_vars:
        lowest = f"engine-{engines[0]}"
        next(roles for roles in groups.values() if lowest in roles).insert(0, ROUTER)
    hosts = []
    for roles in groups.values():
        numbers = sorted(n for n in map(engine_number, roles) if n is not None)
        host_id = f"node-{numbers[0]}" if numbers else ROUTER
        ssh_env = Role.engine(numbers[0]).ssh_env if numbers else ROUTER_SSH
        candidates = [ssh_env] + [role_vars[r] for r in roles if r in role_vars]
        password_env = next(
            (c + PASSWORD_SUFFIX for c in candidates if settings.get(c + PASSWORD_SUFFIX) is not None), None
        )
        hosts.append(HostEntry(id=host_id, ssh_env=ssh_env, password_env=password_env, roles=roles))
    hosts.sort(key=lambda h: h.engine_numbers()[:1])
    return Inventory(hosts=hosts)


def _no_destination(root: Path) -> str:
    """Why no engine has a destination, with the fix: most often the command ran outside the checkout."""
    dotenv = root / DOTENV
    if not dotenv.exists():
        return (
            f"{dotenv} does not exist: {root} is not a management checkout; run in your checkout, pass --root "
            "DIR (Dagster's commands: NARWHAL_ROOT=DIR), or start one from the repository's .env.example"
        )
    return f"{dotenv}: no NARWHAL_NODE_<n>_SSH destination is set"


def load_inventory(path: Path) -> Inventory:
    """Read and structurally check an inventory file; problems name the file and field."""
    try:
        with path.open("rb") as handle:
            data = handle.read(limits.INVENTORY_FILE_BYTES + 1)
        if len(data) > limits.INVENTORY_FILE_BYTES:
            raise InputError([f"{path}: larger than {limits.INVENTORY_FILE_BYTES} bytes (see {limits.DOCS})"])
        raw = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise InputError([f"{path}: inventory not found (run `deploy-hosts plan` to derive it)"]) from None
    except json.JSONDecodeError as exc:
        # `exc.msg` describes the syntax only ("Expecting ',' delimiter"); it never quotes the document.
        where = f"line {exc.lineno} column {exc.colno}"
        raise InputError([f"{path}: {where}: not valid JSON: {exc.msg}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError([f"{path}: not a readable JSON inventory ({type(exc).__name__})"]) from None
    try:
        return Inventory.model_validate(raw)
    except ValidationError as exc:
        raise InputError([f"{path}: {_field(err['loc'])}: {err['msg']}" for err in exc.errors()]) from None


def validate_inventory(inventory: Inventory, settings: Settings, source: str) -> None:
    """Every rule `plan` enforces; raises one line per problem, naming `source` and the field or variable."""
    problems: list[str] = []
    owners: dict[str, str] = {}
    seen_ids: set[str] = set()
    destinations: dict[str, str] = {}
    for index, entry in enumerate(inventory.hosts):
        where = f"{source}: hosts[{index}]"
        if entry.id in seen_ids:
            problems.append(f"{where}.id: duplicate host id {entry.id!r}")
        seen_ids.add(entry.id)
        if not HOST_ID_RE.fullmatch(entry.id):
            problems.append(f"{where}.id: {entry.id!r} must be lowercase letters, digits and '-' (<= 63)")
        for role in entry.roles:
            if role != ROUTER and engine_number(role) is None:
                problems.append(f"{where}.roles: {role!r} is neither 'router' nor 'engine-<n>'")
            if role in owners:
                problems.append(f"{where}.roles: role {role!r} is already owned by host {owners[role]!r}")
            else:
                owners[role] = entry.id
        problems += _access_problems(entry, settings, where)
        destination = settings.get(entry.ssh_env) if entry.ssh_env in entry.role_ssh_envs() else None
        problems += _moved_roles(entry, settings, destination, where)
        if destination:
            if destination in destinations:
                problems.append(
                    f"{where}.ssh_env: {entry.ssh_env} has the same destination as host "
                    f"{destinations[destination]!r}; put all roles of one machine in one entry"
                )
            else:
                destinations[destination] = entry.id
    problems += destination_problems(settings)
    for role, variable in sorted(destination_variables(settings).items()):
        if role not in owners:
            problems.append(
                f"{source}: hosts: {variable} is set but no host owns role {role!r}; add it to the entry of "
                "its machine (or remove the file to derive the inventory again)"
            )
    if ROUTER not in owners:
        problems.append(f"{source}: hosts: no host owns the 'router' role")
    if not any(engine_number(role) is not None for role in owners):
        problems.append(f"{source}: hosts: no host owns an 'engine-<n>' role")
    raise_if(problems)


def _access_problems(entry: HostEntry, settings: Settings, where: str) -> list[str]:
    """`ssh_env` must be a destination variable of one of the entry's roles, `password_env` its `_PASSWORD`.

    Any other name could point a password or an unrelated secret at the resolver and into error text. The
    given name is not echoed: a destination or password pasted here by mistake must not reach logs.
    """
    own = entry.role_ssh_envs()
    host = f"host {entry.id!r}" if HOST_ID_RE.fullmatch(entry.id) else "this host"
    allowed = {"ssh_env": own, "password_env": [name + PASSWORD_SUFFIX for name in own]}
    problems = []
    for field_name, name in (("ssh_env", entry.ssh_env), ("password_env", entry.password_env)):
        if name is None:
            continue
        if name not in allowed[field_name]:
            kind = "destination" if field_name == "ssh_env" else "password"
            choices = " or ".join(allowed[field_name]) or "none: it owns no valid role"
            problems.append(f"{where}.{field_name}: must be the {kind} variable of a role of {host} ({choices})")
        elif settings.get(name) is None or (field_name == "password_env" and not settings.get(name)):
            # An empty destination variable is reported once, by destination_problems.
            problems.append(f"{where}.{field_name}: variable {name} is unset or empty (set it in .env)")
    return problems


def _moved_roles(entry: HostEntry, settings: Settings, destination: str | None, where: str) -> list[str]:
    """Roles whose own destination variable now points elsewhere than their host's `ssh_env`."""
    if not destination:
        return []
    problems = []
    for role in entry.roles:
        parsed = Role.parse(role)
        variable = parsed.ssh_env if parsed else None
        own = settings.get(variable) if variable and variable != entry.ssh_env else None
        if own and own != destination:
            problems.append(
                f"{where}.roles: {role!r} has its own destination {variable}, which differs from the host's "
                f"{entry.ssh_env}; move the role to its machine's entry or give both the same destination"
            )
    return problems


def _role_order(role: str) -> tuple[int, int]:
    number = engine_number(role)
    return (0, 0) if number is None else (1, number)


def _field(loc: tuple[int | str, ...]) -> str:
    if not loc:
        return "(top level)"
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))

"""Role environments (`.env.router`, `.env.engine-<n>`, docs/prepare.md): which variables each role exports, the
layer each value came from, and the credential guard.

Selection is by name from explicit lists (the revision, the ten engine fields, fleet references, the
configured engine credential, tool snapshots), never by scanning settings, so nothing else can slip in. A
variable that names management access, or a value that holds a destination or password, is an error
naming the variable and what pulled it in; nothing is filtered silently.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

from pydantic import Field

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.access_secrets import Scanner, access_needles, access_variables
from narwhal_assets.core.inputs.envfile import render_exports
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import Layer, Settings
from narwhal_assets.core.launch.fleet import API_KEY, REFERENCE_RE, Fleet
from narwhal_assets.core.launch.policy import REQUIRED_FIELDS, required_value
from narwhal_assets.core.records import Record
from narwhal_assets.core.roles import Role, node_variable

EXPORT_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
REVISION = "NARWHAL_DEPLOYMENT_REVISION"
REMOTE_ENV_DIR = "runs/deployment"
REMOTE_TOOLS_DIR = "runs/deployment-tools"
REMOTE_FLEET = f"{REMOTE_ENV_DIR}/fleet.json"
ROUTER_OPTIONAL = ("NARWHAL_ROUTER_URL", "NARWHAL_GRAFANA_BIND_ADDRESS", "NARWHAL_PROMETHEUS_LISTEN_ADDRESS")
# Role-file variable -> the engine-host tool snapshot it points at.
TOOLS = {
    "NARWHAL_ENGINE_LAUNCHER": "launch_engine.py",
    "NARWHAL_FABRIC_BUDGET_TOOL": "fabric_budget.py",
    "NARWHAL_CACHE_CAPTURE_HOOK": "cache_capture_hook.py",
}
# Each snapshot's SHA-256 companion, named as the serving fleet's engine-host checks read it (the fabric
# tool's is `NARWHAL_FABRIC_BUDGET_SHA256`, not `<variable>_SHA256`).
TOOL_DIGESTS = {
    "NARWHAL_ENGINE_LAUNCHER": "NARWHAL_ENGINE_LAUNCHER_SHA256",
    "NARWHAL_FABRIC_BUDGET_TOOL": "NARWHAL_FABRIC_BUDGET_SHA256",
    "NARWHAL_CACHE_CAPTURE_HOOK": "NARWHAL_CACHE_CAPTURE_HOOK_SHA256",
}
SOURCES_SCHEMA: Final = "narwhal.role-environment-sources"


class ExportLayer(StrEnum):
    """Where an exported value came from (settings precedence, lowest first, then what prepare itself sets)."""

    DEFAULT = "default"
    DEPLOYMENT_ENV = "config/deployment.env"
    DOTENV = ".env"
    PROCESS = "process environment"
    PREPARE = "prepare"


_LAYERS = {
    Layer.DEFAULT: ExportLayer.DEFAULT,
    Layer.DISCOVERED: ExportLayer.DEPLOYMENT_ENV,
    Layer.DOTENV: ExportLayer.DOTENV,
    Layer.PROCESS: ExportLayer.PROCESS,
}


class VariableSource(Record):
    """One exported variable's origin: its layer, the setting read, the discovery observation behind a
    discovered value, what pulled the variable into the role file, and (for a value read from a setting)
    the HMAC-SHA256 of the exported value keyed by the run's salt, so `install` can tell the setting has
    changed since without reading any role file."""

    layer: ExportLayer
    variable: str | None = None
    observation: str | None = None
    reason: str
    value_hmac: str | None = None


class RoleFileSources(Record):
    host_id: str
    file: str
    # The variables this file exports besides `every_engine` (engine files export those too).
    variables: dict[str, VariableSource]


class RoleSources(Record):
    """`<out>/sources.json`: for every variable of every role file, where its value came from.

    What every engine role file exports alike (the revision, each node's fabric address, the tools, the
    credential) is listed once under `every_engine`, so the file grows with the roles, not with their
    square (every engine file lists every node's address)."""

    schema_: Literal["narwhal.role-environment-sources"] = Field(default=SOURCES_SCHEMA, alias="schema")
    schema_version: Literal[2] = 2
    revision: str
    salt: str = Field(pattern=r"^[0-9a-f]{64}$")
    every_engine: dict[str, VariableSource]
    roles: dict[str, RoleFileSources]


@dataclass(frozen=True)
class Export:
    value: str
    source: VariableSource


@dataclass(frozen=True)
class RoleEnvironment:
    """One role file: its host, and each variable with value and source. An engine's `shared` exports are one
    mapping for every engine role (built once), its `own` are the rest."""

    role: Role
    host_id: str
    own: dict[str, Export]
    shared: Mapping[str, Export] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The file under the prepared directory: `<host-id>/.env.<role>`."""
        return f"{self.host_id}/{self.role.env_file}"

    @property
    def exports(self) -> dict[str, Export]:
        return {**self.shared, **self.own}

    def render(self) -> str:
        """Sorted `export NAME='literal'` lines; bash reads back exactly the original bytes."""
        return render_exports(self.values())

    def values(self) -> dict[str, str]:
        return {name: export.value for name, export in self.exports.items()}


@dataclass(frozen=True)
class ExportInputs:
    """What role files are built from: effective settings (deployment.env < .env < process), the published
    fleet, the inventory, the approved revision and the tool snapshots' SHA-256 (file name -> digest)."""

    settings: Settings
    inventory: Inventory
    fleet: Fleet
    revision: str
    tool_sha256: Mapping[str, str]
    # Engine number -> the discovery observation file of its host, cited for discovered per-node values.
    observations: Mapping[int, str] = field(default_factory=dict)
    # The key of every `value_hmac` (hex); prepare draws a random one per run.
    salt: str = "0" * 64


@dataclass
class _Context:
    """What every role's collector shares, built once: access variables, one scanner over every access
    value, and the findings of each distinct exported value (every engine file repeats the peer addresses)."""

    inputs: ExportInputs
    access: dict[str, str]
    scanner: Scanner
    seen: dict[str, list[str]] = field(default_factory=dict)

    def findings(self, value: str) -> list[str]:
        if value not in self.seen:
            self.seen[value] = self.scanner.findings(value)
        return self.seen[value]


def build_role_environments(inputs: ExportInputs) -> list[RoleEnvironment]:
    """Every role's environment, router first; all problems of all roles in one error."""
    context = _Context(inputs, access_variables(inputs.settings, inputs.inventory),
                       Scanner(access_needles(inputs.settings, inputs.inventory)))  # fmt: skip
    shared = _Collector(context, None)
    shared.every_engine()
    shared_problems = shared.problems + shared.guard()
    problems: list[str] = []
    built = []
    for entry in inputs.inventory.hosts:
        for role in sorted(filter(None, map(Role.parse, entry.roles))):
            collector = _Collector(context, role, shared.exports if role.is_engine else None)
            if role.is_engine:
                collector.engine()
            else:
                collector.router()
            where = f"role export {entry.id}/{role.env_file}"
            mine = collector.problems + collector.guard() + (shared_problems if role.is_engine else [])
            problems += [f"{where}: {problem}" for problem in mine]
            built.append(RoleEnvironment(role, entry.id, collector.exports, shared.exports if role.is_engine else {}))
    raise_if(problems)
    return sorted(built, key=lambda env: env.role)


def role_sources(inputs: ExportInputs, environments: list[RoleEnvironment]) -> RoleSources:
    """`sources.json` of the role files built from `inputs` (whose salt keyed their value digests)."""
    shared = next((env.shared for env in environments if env.role.is_engine), {})
    return RoleSources(
        revision=inputs.revision,
        salt=inputs.salt,
        every_engine={name: export.source for name, export in sorted(shared.items())},
        roles={
            env.role.name: RoleFileSources(
                host_id=env.host_id,
                file=env.path,
                variables={name: export.source for name, export in sorted(env.own.items())},
            )
            for env in environments
        },
    )


def value_hmac(salt: str, name: str, value: str) -> str:
    """The digest `sources.json` records of a setting's value: HMAC-SHA256 of name and value, keyed by `salt`."""
    return hmac.new(bytes.fromhex(salt), f"{name}\0{value}".encode(), hashlib.sha256).hexdigest()


class _Collector:
    """Builds one role's exports (or, with no role, what every engine file shares); problems are collected,
    not raised, so every role reports at once. They are reported without the file, which the caller adds."""

    def __init__(self, context: _Context, role: Role | None, shared: Mapping[str, Export] | None = None) -> None:
        self.context = context
        self.inputs = context.inputs
        self.role = role
        self.shared = shared or {}
        self.exports: dict[str, Export] = {}
        self.problems: list[str] = []

    def router(self) -> None:
        self.revision()
        self.fixed("NARWHAL_FLEET", REMOTE_FLEET, "the router reads its effective fleet here")
        for index, engine in enumerate(self.inputs.fleet.engines):
            for name in ("url", "attestation_url"):
                match = REFERENCE_RE.fullmatch(getattr(engine, name))
                if match:
                    self.setting(match.group(1), f"fleet engines[{index}].{name}", required=True)
        self.credential()
        for name in ROUTER_OPTIONAL:
            if self.inputs.settings.lookup(name) is not None:
                self.setting(name, "optional router setting")

    def every_engine(self) -> None:
        """What every engine role file exports alike: the revision, every node's fabric address, the
        credential and the tool snapshots."""
        self.revision()
        for m in self.inputs.inventory.engine_numbers():
            self.setting(Role.engine(m).node_var("IP"), "fabric peer address", required=True)
        self.credential(also_as=API_KEY)
        for variable, tool in TOOLS.items():
            self.fixed(variable, f"{REMOTE_TOOLS_DIR}/{tool}", f"snapshot of narwhal_assets/host/tools/{tool}")
            self.fixed(TOOL_DIGESTS[variable], self.inputs.tool_sha256[tool], f"SHA-256 of the {tool} snapshot")

    def engine(self) -> None:
        """The engine's own exports; `shared` holds the rest."""
        assert self.role is not None and self.role.number is not None
        n = self.role.number
        for spec in REQUIRED_FIELDS:
            try:
                resolved = required_value(self.inputs.settings, n, spec.name)
            except InputError as exc:
                self.problems += exc.problems
                continue
            reason = f"engine field {spec.variable}"
            self.put(spec.variable, resolved.value or "", resolved.variable, reason)
        for name in ("URL", "ATTESTATION_URL"):
            variable = self.role.node_var(name)
            if self.inputs.settings.lookup(variable) is not None:
                self.setting(variable, "the engine's own service URL")
        self.fixed("NARWHAL_ENGINE_LAUNCH_CONFIG", f"config/{self.role.launch_file}", "the engine's launch record")

    def revision(self) -> None:
        found = self.inputs.settings.lookup(REVISION)
        layer = _LAYERS[found[1]] if found else ExportLayer.PREPARE
        source = VariableSource(layer=layer, variable=REVISION, reason="the approved source revision",
                                value_hmac=value_hmac(self.inputs.salt, REVISION, self.inputs.revision))  # fmt: skip
        self.exports[REVISION] = Export(self.inputs.revision, source)

    def credential(self, also_as: str | None = None) -> None:
        configured = self.inputs.fleet.engine
        if configured is None:
            return
        name, reason = configured.engine_api_key_env, "fleet engine.engine_api_key_env"
        self.setting(name, reason, required=True)
        if also_as and name in self.exports and not self.refused_name(name):
            export = self.exports[name]
            alias = export.source.model_copy(update={"reason": f"{reason} (as {also_as})"})
            self.exports.setdefault(also_as, Export(export.value, alias))

    def setting(self, name: str, reason: str, *, required: bool = False) -> None:
        """Export `name` under its own name from the settings; `required` makes unset or empty an error."""
        value = self.inputs.settings.get(name)
        if required and not value and not self.refused_name(name):  # a refused name is reported as such
            self.problems.append(f"{name} ({reason}) is unset or empty; set it in .env or run `deploy-hosts discover`")
            return
        self.put(name, value or "", name, reason)

    def put(self, name: str, value: str, variable: str | None, reason: str) -> None:
        if name in self.exports or name in self.shared:
            return
        found = self.inputs.settings.lookup(variable) if variable else None
        layer = _LAYERS[found[1]] if found else ExportLayer.DEFAULT
        node = node_variable(variable) if variable and layer is ExportLayer.DEPLOYMENT_ENV else None
        observation = self.inputs.observations.get(node[0]) if node else None
        digest = value_hmac(self.inputs.salt, variable, value) if variable else None
        source = VariableSource(layer=layer, variable=variable, observation=observation, reason=reason,
                                value_hmac=digest)  # fmt: skip
        self.exports[name] = Export(value, source)

    def fixed(self, name: str, value: str, reason: str) -> None:
        if name not in self.shared:
            self.exports.setdefault(name, Export(value, VariableSource(layer=ExportLayer.PREPARE, reason=reason)))

    def guard(self) -> list[str]:
        """The credential guard: names that are or look like management access, and values holding any."""
        problems = []
        for name, export in sorted(self.exports.items()):
            pulled_in = f"{name} ({export.source.reason})"
            if refused := self.refused_name(name):
                problems.append(f"{pulled_in}{refused}")
            elif hits := self.context.findings(export.value):
                problems.append(f"{pulled_in}: its value contains {', '.join(hits)}")
        return problems

    def refused_name(self, name: str) -> str | None:
        """Why `name` may not be exported (the end of an error line), or None."""
        if not EXPORT_NAME_RE.fullmatch(name):
            return ": variable names must match [A-Z][A-Z0-9_]*"
        if "SSH" in name:
            return " names SSH access; management access never leaves the workstation (remove the reference)"
        if name in self.context.access:
            return (f" is {self.context.access[name]}; management access never leaves the workstation (remove the "
                    "reference)")  # fmt: skip
        return None

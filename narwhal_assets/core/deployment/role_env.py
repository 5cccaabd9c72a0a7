"""Role environments (`.env.router`, `.env.engine-<n>`, docs/prepare.md): which variables each role exports, the
layer each value came from, and the credential guard.

Selection is by name from explicit lists (the revision, the ten engine fields, fleet references, the
configured engine credential, tool snapshots), never by scanning settings, so nothing else can slip in. A
variable that names management access, or a value that holds a destination or password, is an error
naming the variable and what pulled it in; nothing is filtered silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import Field

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.access_secrets import access_needles, access_variables, findings
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
SOURCES_SCHEMA = "narwhal.role-environment-sources"


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
    discovered value, and what pulled the variable into the role file."""

    layer: ExportLayer
    variable: str | None = None
    observation: str | None = None
    reason: str


class RoleFileSources(Record):
    host_id: str
    file: str
    variables: dict[str, VariableSource]


class RoleSources(Record):
    """`<out>/sources.json`: for every variable of every role file, where its value came from."""

    schema_: Literal["narwhal.role-environment-sources"] = Field(default=SOURCES_SCHEMA, alias="schema")
    schema_version: Literal[1] = 1
    revision: str
    roles: dict[str, RoleFileSources]


@dataclass(frozen=True)
class Export:
    value: str
    source: VariableSource


@dataclass(frozen=True)
class RoleEnvironment:
    """One role file: its host, and each variable with value and source."""

    role: Role
    host_id: str
    exports: dict[str, Export]

    @property
    def path(self) -> str:
        """The file under the prepared directory: `<host-id>/.env.<role>`."""
        return f"{self.host_id}/{self.role.env_file}"

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


def build_role_environments(inputs: ExportInputs) -> list[RoleEnvironment]:
    """Every role's environment, router first; all problems of all roles in one error."""
    problems: list[str] = []
    built = []
    for entry in inputs.inventory.hosts:
        for role in sorted(filter(None, map(Role.parse, entry.roles))):
            collector = _Collector(inputs, role, entry.id)
            if role.is_engine:
                collector.engine()
            else:
                collector.router()
            problems += collector.problems + collector.guard()
            built.append(RoleEnvironment(role, entry.id, collector.exports))
    raise_if(problems)
    return sorted(built, key=lambda env: env.role)


def role_sources(revision: str, environments: list[RoleEnvironment]) -> RoleSources:
    return RoleSources(
        revision=revision,
        roles={
            env.role.name: RoleFileSources(
                host_id=env.host_id,
                file=env.path,
                variables={name: export.source for name, export in sorted(env.exports.items())},
            )
            for env in environments
        },
    )


class _Collector:
    """Builds one role's exports; problems are collected, not raised, so every role reports at once."""

    def __init__(self, inputs: ExportInputs, role: Role, host_id: str) -> None:
        self.inputs = inputs
        self.role = role
        self.host_id = host_id
        self.exports: dict[str, Export] = {}
        self.problems: list[str] = []
        self.access = access_variables(inputs.settings, inputs.inventory)
        self.needles = access_needles(inputs.settings, inputs.inventory)

    @property
    def where(self) -> str:
        return f"role export {self.host_id}/{self.role.env_file}"

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

    def engine(self) -> None:
        n = self.role.number
        assert n is not None
        self.revision()
        for spec in REQUIRED_FIELDS:
            try:
                resolved = required_value(self.inputs.settings, n, spec.name)
            except InputError as exc:
                self.problems += [f"{self.where}: {problem}" for problem in exc.problems]
                continue
            reason = f"engine field {spec.variable}"
            self.put(spec.variable, resolved.value or "", resolved.variable, reason)
        for m in self.inputs.inventory.engine_numbers():
            self.setting(Role.engine(m).node_var("IP"), "fabric peer address", required=True)
        for name in ("URL", "ATTESTATION_URL"):
            variable = self.role.node_var(name)
            if self.inputs.settings.lookup(variable) is not None:
                self.setting(variable, "the engine's own service URL")
        self.credential(also_as=API_KEY)
        self.fixed("NARWHAL_ENGINE_LAUNCH_CONFIG", f"config/{self.role.launch_file}", "the engine's launch record")
        for variable, tool in TOOLS.items():
            self.fixed(variable, f"{REMOTE_TOOLS_DIR}/{tool}", f"snapshot of narwhal_assets/host/tools/{tool}")
            self.fixed(TOOL_DIGESTS[variable], self.inputs.tool_sha256[tool], f"SHA-256 of the {tool} snapshot")

    def revision(self) -> None:
        found = self.inputs.settings.lookup(REVISION)
        layer = _LAYERS[found[1]] if found else ExportLayer.PREPARE
        self.exports[REVISION] = Export(self.inputs.revision, VariableSource(layer=layer, variable=REVISION,
                                                                             reason="the approved source revision"))

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
            self.problems.append(f"{self.where}: {name} ({reason}) is unset or empty; set it in .env or run "
                                 "`deploy-hosts discover`")
            return
        self.put(name, value or "", name, reason)

    def put(self, name: str, value: str, variable: str | None, reason: str) -> None:
        if name in self.exports:
            return
        found = self.inputs.settings.lookup(variable) if variable else None
        layer = _LAYERS[found[1]] if found else ExportLayer.DEFAULT
        node = node_variable(variable) if variable and layer is ExportLayer.DEPLOYMENT_ENV else None
        observation = self.inputs.observations.get(node[0]) if node else None
        source = VariableSource(layer=layer, variable=variable, observation=observation, reason=reason)
        self.exports[name] = Export(value, source)

    def fixed(self, name: str, value: str, reason: str) -> None:
        self.exports.setdefault(name, Export(value, VariableSource(layer=ExportLayer.PREPARE, reason=reason)))

    def guard(self) -> list[str]:
        """The credential guard: names that are or look like management access, and values holding any."""
        problems = []
        for name, export in sorted(self.exports.items()):
            pulled_in = f"{name} ({export.source.reason})"
            if refused := self.refused_name(name):
                problems.append(f"{self.where}: {pulled_in}{refused}")
            elif hits := findings(export.value, self.needles):
                problems.append(f"{self.where}: {pulled_in}: its value contains {', '.join(hits)}")
        return problems

    def refused_name(self, name: str) -> str | None:
        """Why `name` may not be exported (the end of an error line), or None."""
        if not EXPORT_NAME_RE.fullmatch(name):
            return ": variable names must match [A-Z][A-Z0-9_]*"
        if "SSH" in name:
            return " names SSH access; management access never leaves the workstation (remove the reference)"
        if name in self.access:
            return f" is {self.access[name]}; management access never leaves the workstation (remove the reference)"
        return None

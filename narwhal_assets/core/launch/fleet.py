"""`config/fleet.json`: what the router serves and where, with endpoints as `${VAR}` references.

URLs stay references so one fleet file works with every prepared role environment; the values live in
`config/deployment.env` and the role files.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal, cast

from pydantic import Field

from narwhal_assets.core.discovery.observations import HostObservation
from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.launch.models import EngineLaunchConfig, ServingRole
from narwhal_assets.core.launch.policy import required_value
from narwhal_assets.core.records import Record
from narwhal_assets.core.roles import Role

REFERENCE_RE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")
API_KEY = "NARWHAL_ENGINE_API_KEY"
API_KEY_ENV = "NARWHAL_ENGINE_API_KEY_ENV"
ROLES: tuple[str, ...] = ("prefill", "decode")
_ENV_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_LAUNCH_FILE = "config/engine-launch.local.json"


class Hardware(Record):
    accelerator: str
    accelerators_per_engine: int
    tensor_parallel: int


class FleetEngine(Record):
    iid: str
    url: str
    attestation_url: str
    role: ServingRole


class Slo(Record):
    ttft_s: int | float = 10
    tpot_s: int | float = 0.125


class Thresholds(Record):
    expand: float = 1.0
    shrink: float = 0.5


class Controller(Record):
    min_prefill: int = 1
    min_decode: int = 1
    thresholds: Thresholds = Field(default_factory=Thresholds)


class Profiles(Record):
    path: str = "runs/profiles.json"


class EngineCredential(Record):
    engine_api_key_env: str


class Fleet(Record):
    """`config/fleet.json` (the router reads its copy `runs/deployment/fleet.json`)."""

    schema_: Literal["narwhal.fleet"] = Field(default="narwhal.fleet", alias="schema")
    schema_version: Literal[1] = 1
    model: str
    hardware: Hardware
    engines: list[FleetEngine]
    slo: Slo = Field(default_factory=Slo)
    controller: Controller = Field(default_factory=Controller)
    profiles: Profiles = Field(default_factory=Profiles)
    engine: EngineCredential | None = None

    def role_of(self, n: int) -> ServingRole:
        """Engine `n`'s role, for its per-engine launch file."""
        return next(e.role for e in self.engines if e.iid == Role.engine(n).iid)


def build_fleet(
    settings: Settings,
    inventory: Inventory,
    observations: Mapping[str, HostObservation],
    launch: EngineLaunchConfig,
) -> Fleet:
    """The fleet for the inventory's engines; hardware comes from the launch records.

    Every engine must be observed and have a launch record; all must share one GPU product, GPU count and
    tensor-parallel size, because the router's profiles assume interchangeable engines of a role.
    """
    numbers = inventory.engine_numbers()
    problems = engine_count_problems(settings, numbers)
    for n in numbers:
        host_id = inventory.host_for_role(Role.engine(n).name).id
        if host_id not in observations:
            problems.append(f"host {host_id}: no observation for engine-{n} (run discovery)")
        if Role.engine(n).name not in launch.engines:
            problems.append(f"{_LAUNCH_FILE}: engines: no record for engine-{n}")
    raise_if(problems)
    roles = engine_roles(settings, numbers)
    return Fleet(
        model=_model_name(settings, numbers),
        hardware=_hardware(launch, numbers),
        engines=[
            FleetEngine(
                iid=Role.engine(n).iid,
                url=reference(Role.engine(n).node_var("URL")),
                attestation_url=reference(Role.engine(n).node_var("ATTESTATION_URL")),
                role=roles[n],
            )
            for n in numbers
        ],
        engine=engine_credential(settings),
    )


def engine_count_problems(settings: Settings, numbers: list[int]) -> list[str]:
    """A fleet serves with at least one prefill and one decode engine."""
    if len(numbers) >= 2:
        return []
    return [f"{settings.hosts_path}: hosts: the fleet needs at least two engines (one prefill, one decode); found "
            f"{len(numbers)}"]  # fmt: skip


def engine_roles(settings: Settings, numbers: list[int]) -> dict[int, ServingRole]:
    """`NARWHAL_NODE_<n>_ROLE` (prefill or decode); by default the first engine prefills, the rest decode."""
    roles: dict[int, ServingRole] = {}
    problems = []
    for index, n in enumerate(numbers):
        variable = Role.engine(n).node_var("ROLE")
        value = settings.get(variable) or ("prefill" if index == 0 else "decode")
        if value == "prefill" or value == "decode":
            roles[n] = cast("ServingRole", value)
        else:
            problems.append(f"engine-{n}: {variable} must be prefill or decode")
    raise_if(problems)
    missing = [role for role in ROLES if role not in roles.values()]
    if missing:
        raise InputError(
            [
                f"fleet: no {role} engine; set NARWHAL_NODE_<n>_ROLE so that at least one engine "
                "prefills and one decodes"
                for role in missing
            ]
        )
    return roles


def engine_credential(settings: Settings) -> EngineCredential | None:
    """The engine credential's variable NAME, when one is configured.

    `NARWHAL_ENGINE_API_KEY_ENV` names the variable holding the key (and then it must be set); otherwise a
    non-empty `NARWHAL_ENGINE_API_KEY` is the credential. The value itself never enters the fleet.
    """
    named = settings.get(API_KEY_ENV)
    if named:
        if not _ENV_NAME_RE.fullmatch(named) or "SSH" in named:
            raise InputError([f"{API_KEY_ENV} must name an upper-case variable without SSH"])
        if not settings.get(named):
            raise InputError([f"{API_KEY_ENV} names {named}, which is unset or empty (set it in .env)"])
        return EngineCredential(engine_api_key_env=named)
    return EngineCredential(engine_api_key_env=API_KEY) if settings.get(API_KEY) else None


def reference(name: str) -> str:
    """A whole-value `${NAME}` reference, the only form the router resolves."""
    return "${" + name + "}"


def fleet_references(fleet: Fleet) -> set[str]:
    """Variables the fleet references: whole-value `${NAME}` strings, NAME without `SSH`."""
    refs = set()
    for value in _strings(fleet.model_dump(by_alias=True)):
        match = REFERENCE_RE.fullmatch(value)
        if match and "SSH" not in match.group(1):
            refs.add(match.group(1))
    return refs


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _model_name(settings: Settings, numbers: list[int]) -> str:
    """One served model name for the whole fleet (the router routes by it)."""
    resolved = [required_value(settings, n, "ENGINE_MODEL_NAME") for n in numbers]
    names = {r.value for r in resolved}
    if len(names) != 1:
        raise InputError(
            [
                f"fleet: engines serve different model names ({', '.join(sorted(r.name for r in resolved))}"
                "); every engine must serve one NARWHAL_ENGINE_MODEL_NAME"
            ]
        )
    return resolved[0].value or ""


def _hardware(launch: EngineLaunchConfig, numbers: list[int]) -> Hardware:
    """Fleet hardware; engines that differ in GPU product, count or TP size are refused."""
    per_engine = {n: launch.engines[Role.engine(n).name] for n in numbers}
    checks = (
        ("accelerator", "GPU product", lambda e: e.accelerator),
        ("gpu_ids", "GPU count", lambda e: len(e.gpu_ids)),
        ("tensor_parallel_size", "tensor-parallel size", lambda e: e.tensor_parallel_size),
    )
    problems = []
    for field, what, get in checks:
        if len({get(e) for e in per_engine.values()}) > 1:
            found = "; ".join(f"engine-{n}: {get(e)}" for n, e in per_engine.items())
            problems.append(
                f"{_LAUNCH_FILE}: engines.*.{field}: engines differ in {what} ({found}); every engine must use the same"
            )
    raise_if(problems)
    first = per_engine[numbers[0]]
    return Hardware(
        accelerator=first.accelerator,
        accelerators_per_engine=len(first.gpu_ids),
        tensor_parallel=first.tensor_parallel_size,
    )

"""`profiling-limits.json`: each engine's `--max-num-seqs`, so profiling binds decode cohorts to launch settings.

The limit is read back from each launch record's `runtime.extra_args`, where the serving fleet's profiler
and launcher read it, rather than from the policy, so it is exactly what the engine will be started with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from narwhal_assets.core.errors import InputError, Problems
from narwhal_assets.core.launch.fleet import Fleet
from narwhal_assets.core.launch.models import EngineLaunchConfig
from narwhal_assets.core.roles import Role

FLAG = "--max-num-seqs"


class ProfilingLimits(BaseModel):
    """`profiling-limits.json` beside the router's effective fleet."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    schema_: Literal["narwhal.profiling-limits"] = Field(default="narwhal.profiling-limits", alias="schema")
    schema_version: Literal[1] = 1
    engines: dict[str, int]


def build_profiling_limits(fleet: Fleet, engine_records: EngineLaunchConfig, records_path: str) -> ProfilingLimits:
    """One limit per fleet iid; the records (read from `records_path`) must cover exactly the fleet's engines."""
    by_iid = {_iid(role): (role, entry) for role, entry in engine_records.engines.items()}
    fleet_iids = [engine.iid for engine in fleet.engines]
    problems = Problems(f"{records_path}: engines: no record for fleet engine {iid}"
                        for iid in fleet_iids if iid not in by_iid)  # fmt: skip
    problems += [f"{records_path}: engines: {iid} is not an engine of the fleet"
                 for iid in sorted(set(by_iid) - set(fleet_iids))]  # fmt: skip
    limits: dict[str, int] = {}
    for iid in fleet_iids:
        if iid in by_iid:
            role, entry = by_iid[iid]
            limit = problems.attempt(max_num_seqs, entry.runtime.extra_args,
                                     f"{records_path}: engines.{role}.runtime.extra_args")  # fmt: skip
            if limit is not None:
                limits[iid] = limit
    problems.raise_if_any()
    return ProfilingLimits(engines=limits)


def max_num_seqs(args: Sequence[str], where: str) -> int:
    """The single positive `--max-num-seqs` of a launch command line (`--flag N` or `--flag=N`)."""
    values = [args[i + 1] if i + 1 < len(args) else "" for i, arg in enumerate(args) if arg == FLAG]
    values += [arg.split("=", 1)[1] for arg in args if arg.startswith(FLAG + "=")]
    if len(values) != 1:
        raise InputError([f"{where}: expected exactly one {FLAG}, found {len(values)}"])
    if not values[0].isdigit() or int(values[0]) <= 0:
        raise InputError([f"{where}: {FLAG} must be a positive integer"])
    return int(values[0])


def _iid(role: str) -> str:
    parsed = Role.parse(role)
    return parsed.iid if parsed and parsed.is_engine else role

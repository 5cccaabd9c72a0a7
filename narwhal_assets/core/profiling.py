"""`profiling-limits.json`: each engine's `--max-num-seqs`, so profiling binds decode cohorts to launch settings.

The limit is read back from the generated launch arguments rather than from the policy, so it is exactly
what the engine will be started with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.fleet import Fleet
from narwhal_assets.core.launch_models import EngineLaunchConfig

FLAG = "--max-num-seqs"
_ENGINE_RE = re.compile(r"engine-([1-9][0-9]*)")


class ProfilingLimits(BaseModel):
    """`profiling-limits.json` beside the router's effective fleet."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    schema_: Literal["narwhal.profiling-limits"] = Field(default="narwhal.profiling-limits", alias="schema")
    schema_version: Literal[1] = 1
    engines: dict[str, int]


def build_profiling_limits(fleet: Fleet, engine_records: EngineLaunchConfig) -> ProfilingLimits:
    """One limit per fleet iid; the records must cover exactly the fleet's engines."""
    by_iid = {_iid(role): (role, entry) for role, entry in engine_records.engines.items()}
    fleet_iids = [engine.iid for engine in fleet.engines]
    problems = [f"config/engine-launch.local.json: engines: no record for fleet engine {iid}"
                for iid in fleet_iids if iid not in by_iid]
    problems += [f"config/engine-launch.local.json: engines: {iid} is not an engine of the fleet"
                 for iid in sorted(set(by_iid) - set(fleet_iids))]
    limits: dict[str, int] = {}
    for iid in fleet_iids:
        if iid in by_iid:
            role, entry = by_iid[iid]
            try:
                limits[iid] = max_num_seqs(entry.args, f"config/engine-launch.local.json: engines.{role}.args")
            except InputError as exc:
                problems += exc.problems
    raise_if(problems)
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
    match = _ENGINE_RE.fullmatch(role)
    return f"n{match.group(1)}" if match else role

"""Which old discovery runs and checkpoint file tables may be deleted: pure decisions, no file access.

A run is *complete* when it published a config set (it has a manifest). The newest `keep` complete runs
stay, and so does the run the current config set came from, whatever its age (it holds the archive of
the set before it and the observations the set was built from). An incomplete run stays while it may
still be in progress (activity after `stale_before`) or while it is newer than the oldest kept complete
run (a recent failure is worth reading). File table objects go when no remaining run refers to them and
they are not fresh (a run in progress writes its objects before the record that refers to them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from narwhal_assets.core.errors import InputError

KEEP_RUNS_VARIABLE = "NARWHAL_DISCOVERY_KEEP_RUNS"
KEEP_RUNS_DEFAULT = 10
KEEP_RUNS_MAX = 10_000

__all__ = ["KEEP_RUNS_DEFAULT", "KEEP_RUNS_VARIABLE", "RunInfo", "keep_runs", "objects_to_remove", "runs_to_remove"]


@dataclass(frozen=True)
class RunInfo:
    """One `runs/discovery/<run>` directory as retention sees it.

    `order` sorts runs oldest first (the caller's notion of run age, e.g. start time then manifest time);
    `last_activity` is the newest modification time inside the run, in seconds.
    """

    name: str
    complete: bool
    order: tuple[str | int | float, ...]
    last_activity: float


def keep_runs(value: str | None) -> int:
    """The retention setting: how many complete runs to keep (unset: the default; at least 1)."""
    if value is None or value == "":
        return KEEP_RUNS_DEFAULT
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= KEEP_RUNS_MAX:
        raise InputError([f"{KEEP_RUNS_VARIABLE} must be a whole number from 1 to {KEEP_RUNS_MAX}"])
    return int(value)


def runs_to_remove(runs: Sequence[RunInfo], keep: int, current: str | None, stale_before: float) -> list[str]:
    """Names of the runs to delete, oldest first; never `current`, never one of the newest `keep` complete."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    ordered = sorted(runs, key=lambda run: run.order)
    complete = [run for run in ordered if run.complete]
    kept = {run.name for run in complete[-keep:]} | ({current} if current else set())
    oldest_kept = min((run.order for run in ordered if run.name in kept), default=None)
    remove = []
    for run in ordered:
        if run.name in kept:
            continue
        if not run.complete and (run.last_activity >= stale_before or (oldest_kept and run.order > oldest_kept)):
            continue
        remove.append(run.name)
    return remove


def objects_to_remove(objects: Mapping[str, float], referenced: Iterable[str], stale_before: float) -> list[str]:
    """Object names (sorted) that no remaining run refers to and that were written before `stale_before`."""
    still_used = set(referenced)
    return sorted(name for name, written in objects.items() if name not in still_used and written < stale_before)

"""Which deployment directories `deploy-hosts prune` removes, on hosts and on the workstation: pure decisions.

On a host the newest `keep` installed deployments stay, counted by marker time with `current` always among
them; a locked directory (an install under way) and anything that is not a deployment stay too. On the
workstation a prepared run stays while it is among the newest `keep`, while its deployment is still on some
host, or while some host's `current` names it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostDirectory:
    """One `~/Narwhal-deploy/<id>` as `status` reported it (`installed_at`: marker time, None without marker)."""

    name: str
    state: str  # installed / incomplete / locked / foreign
    installed_at: float | None
    current: bool


@dataclass(frozen=True)
class PreparedRunInfo:
    """One prepared run on the workstation; `order` sorts runs oldest first (its manifest's `created_at`)."""

    name: str
    deployment_id: str
    order: str


def host_directories_to_remove(directories: Sequence[HostDirectory], keep: int) -> list[str]:
    """Names to remove, oldest first: incomplete ones, and installed ones beyond the newest `keep`."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    installed = sorted((d for d in directories if d.state == "installed"), key=lambda d: d.installed_at or 0.0)
    kept = {d.name for d in directories if d.current}
    for directory in reversed(installed):
        if len(kept) >= keep:
            break
        kept.add(directory.name)
    remove = [d.name for d in directories if d.state == "incomplete" and not d.current]
    return remove + [d.name for d in installed if d.name not in kept]


def prepared_runs_to_remove(
    runs: Sequence[PreparedRunInfo], keep: int, present: Collection[str], current: Collection[str]
) -> list[str]:
    """Run names to remove, oldest first: not among the newest `keep`, deployment on no host, not current."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    ordered = sorted(runs, key=lambda run: run.order)
    newest = {run.name for run in ordered[-keep:]}
    return [run.name for run in ordered if run.name not in newest and run.deployment_id not in present
            and run.deployment_id not in current]  # fmt: skip

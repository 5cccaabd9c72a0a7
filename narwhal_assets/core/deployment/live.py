"""Drift between what Dagster last installed on a host and what the host runs: one rule for CLI and check.

A host drifts when a live observation newer than its last `host_installation` materialization shows
another deployment in service (or none): `current` moved outside the tool. An observation's time is when
its read began, so an install or rollback committed after that (even one Dagster recorded before the
observation itself) sets `current` itself and is not drift until a newer observation says otherwise; nor is
a host that was seen with an install in progress (a deployment's lock held), whose `current` is the
installer's to move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from narwhal_assets.core.deployment.installed import Installed


@dataclass(frozen=True)
class Recorded:
    """A deployment as one Dagster event recorded it for one host (None: no deployment in service)."""

    deployment_id: str | None
    revision: str | None
    timestamp: float  # for a live observation: when its read of the host began
    install_in_progress: bool = False  # a live observation saw a deployment's lock held


def drifting(installed: Mapping[str, Installed | None], live: Mapping[str, Recorded | None]) -> list[str]:
    """Host ids (sorted) whose newest live observation contradicts their last materialization."""
    hosts = []
    for host_id in sorted(live):
        seen, done = live[host_id], installed.get(host_id)
        if seen is None or seen.install_in_progress or (done is not None and done.timestamp >= seen.timestamp):
            continue
        if (done.deployment_id if done else None) != seen.deployment_id:
            hosts.append(host_id)
    return hosts

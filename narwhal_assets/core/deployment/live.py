"""Drift between what Dagster last installed on a host and what the host runs: one rule for CLI and check.

A host drifts when a live observation newer than its last `host_installation` materialization shows
another deployment in service (or none). An install or rollback after the observation sets `current`
itself, so it is not drift until a newer observation says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Recorded:
    """A deployment as one Dagster event recorded it for one host (None: no deployment in service)."""

    deployment_id: str | None
    revision: str | None
    timestamp: float


def drifting(installed: Mapping[str, Recorded | None], live: Mapping[str, Recorded | None]) -> list[str]:
    """Host ids (sorted) whose newest live observation contradicts their last materialization."""
    hosts = []
    for host_id in sorted(live):
        seen, done = live[host_id], installed.get(host_id)
        if seen is None or (done is not None and done.timestamp >= seen.timestamp):
            continue
        if (done.deployment_id if done else None) != seen.deployment_id:
            hosts.append(host_id)
    return hosts

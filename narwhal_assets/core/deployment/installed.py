"""Which hosts run the latest prepared deployment: each host's latest installation against the latest manifest. Pure.

One rule serves the `installed_from_latest_manifest` check (hosts to name) and the re-verification schedule
(hosts to re-verify): a host is current when its latest successful installation has the deployment id of the
latest `deployment_manifest`; otherwise it is outdated (another deployment) or never installed. `Installed`
is also what the live-drift rule (`core.deployment.live`) compares the newest live observation with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CURRENT = "current"
OUTDATED = "outdated"
NEVER = "never installed"


@dataclass(frozen=True)
class Installed:
    """What a host's latest successful installation recorded, and when Dagster recorded it.

    Only drift needs the time (an observation older than the installation is not drift); comparing deployment
    ids does not, so it may be left at 0.
    """

    deployment_id: str
    revision: str
    timestamp: float = 0.0


@dataclass(frozen=True)
class HostState:
    host_id: str
    state: str
    installed: Installed | None


def compare_installed(latest: str, installed: Mapping[str, Installed | None]) -> list[HostState]:
    """Each host (sorted) as current, outdated or never installed against the latest deployment id."""
    return [HostState(host_id, _state(latest, found), found) for host_id, found in sorted(installed.items())]


def _state(latest: str, found: Installed | None) -> str:
    if found is None:
        return NEVER
    return CURRENT if found.deployment_id == latest else OUTDATED

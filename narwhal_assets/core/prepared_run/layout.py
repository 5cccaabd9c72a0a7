"""The prepared directory's layout (docs/prepare.md, "Layout"): which files each physical host gets and where
`install` puts each of them inside the remote checkout."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import PROFILING_LIMITS_FILE
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.launch_records import engine_launch_file, engines_by_host
from narwhal_assets.core.launch.models import EngineLaunchConfig, ServingRole
from narwhal_assets.core.prepared_run.manifest import PreparedFile
from narwhal_assets.core.prepared_run.role_env import REMOTE_ENV_DIR, REMOTE_TOOLS_DIR, TOOLS, RoleEnvironment
from narwhal_assets.core.roles import Role

FLEET_COPY = "fleet.local.json"
SOURCES_FILE = "sources.json"


@dataclass(frozen=True)
class PlannedFile:
    """One file to write under `<out>` (`path`) and to install on its host (`install_to`)."""

    path: str
    install_to: str | None
    data: bytes
    keep_if_present: bool = False

    def prepared(self) -> PreparedFile:
        return PreparedFile(
            path=self.path,
            install_to=self.install_to,
            sha256=hashlib.sha256(self.data).hexdigest(),
            size=len(self.data),
            keep_if_present=self.keep_if_present,
        )


@dataclass(frozen=True)
class PublishedSet:
    """The published config set as prepare ships it: launch records plus the router's two files' bytes."""

    launch: EngineLaunchConfig
    fleet_bytes: bytes
    profiling_limits_bytes: bytes
    fleet_roles: Mapping[int, ServingRole]

    @cached_property
    def host_engines(self) -> dict[str, list[str]]:
        """Each host's engines, found once for every host's per-engine files."""
        return engines_by_host(self.launch)


def host_files(
    entry: HostEntry,
    environments: Mapping[str, RoleEnvironment],
    published: PublishedSet,
    tools: Mapping[str, bytes],
) -> list[PlannedFile]:
    """Role files, per-engine launch files and tool snapshots (engine hosts), the fleet copy and profiling
    limits (the router's host), in that order; paths are `<host-id>/<name>`."""
    roles = sorted(filter(None, map(Role.parse, entry.roles)))
    files = []
    for role in roles:
        env = environments[role.name]
        files.append(PlannedFile(f"{entry.id}/{role.env_file}", f"{REMOTE_ENV_DIR}/{role.env_file}",
                                 env.render().encode("utf-8")))  # fmt: skip
        if role.is_engine:
            files.append(_launch_file(entry.id, role, published))
    if any(role.is_engine for role in roles):
        files += [PlannedFile(f"{entry.id}/{t}", f"{REMOTE_TOOLS_DIR}/{t}", tools[t]) for t in TOOLS.values()]
    if any(not role.is_engine for role in roles):
        files.append(PlannedFile(f"{entry.id}/{FLEET_COPY}", f"{REMOTE_ENV_DIR}/fleet.json", published.fleet_bytes,
                                 keep_if_present=True))  # fmt: skip
        files.append(PlannedFile(f"{entry.id}/{PROFILING_LIMITS_FILE}", f"{REMOTE_ENV_DIR}/{PROFILING_LIMITS_FILE}",
                                 published.profiling_limits_bytes))  # fmt: skip
    return files


def _launch_file(host_id: str, role: Role, published: PublishedSet) -> PlannedFile:
    n = role.number
    assert n is not None
    fleet_role = published.fleet_roles.get(n)
    if fleet_role is None:
        raise InputError([f"fleet: engines: no engine {role.iid} for {role.name}; run `deploy-hosts discover`"])
    record = engine_launch_file(published.launch, n, fleet_role, published.host_engines.get(host_id, []))
    return PlannedFile(f"{host_id}/{role.launch_file}", f"config/{role.launch_file}", render_json(record).encode())

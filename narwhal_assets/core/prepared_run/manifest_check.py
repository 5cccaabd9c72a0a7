"""Manifest verification before `install` or a role shell contacts any host (docs/install.md, step 1).

A prepared directory may only be installed while it still describes the fleet: the same hosts, roles and
access variables as the current inventory, the same destinations (compared as SHA-256 digests) and pinned
host keys, exactly the files the assigned roles need, and every file's bytes as pinned. Every mismatch is
reported (one line each) with its fix: a new `prepare`, or for a changed destination (a discovery input)
discovery, `prepare` and installing the new run.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from narwhal_assets.core.errors import InputError, raise_if
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import PROFILING_LIMITS_FILE
from narwhal_assets.core.prepared_run.manifest import (
    BUNDLE_FILE,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    PREPARED_FORMAT,
    DeploymentManifest,
    ManifestHost,
    PreparedFile,
)
from narwhal_assets.core.prepared_run.role_env import REMOTE_ENV_DIR, REMOTE_FLEET, REMOTE_TOOLS_DIR, TOOLS
from narwhal_assets.core.roles import Role

FIX = "prepare a new run (`deploy-hosts prepare`)"
REDISCOVER_FIX = "run `deploy-hosts discover`, then `deploy-hosts prepare`, then install the new run"


@dataclass(frozen=True)
class CurrentAccess:
    """What the workstation holds now for one host: its destination's digest and the store's pinned keys."""

    destination_sha256: str | None
    fingerprints: tuple[str, ...]


def destination_sha256(destination: str) -> str:
    """How the manifest pins a destination without holding it: SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(destination.encode("utf-8")).hexdigest()


def expected_targets(roles: list[str]) -> dict[str, bool]:
    """Where each file a host's roles need is installed in the checkout -> whether a present one is kept."""
    targets: dict[str, bool] = {}
    parsed = [r for r in (Role.parse(name) for name in roles) if r is not None]
    for role in parsed:
        targets[f"{REMOTE_ENV_DIR}/{role.env_file}"] = False
        if role.is_engine:
            targets[f"config/{role.launch_file}"] = False
        else:
            targets[REMOTE_FLEET] = True
            targets[f"{REMOTE_ENV_DIR}/{PROFILING_LIMITS_FILE}"] = False
    if any(role.is_engine for role in parsed):
        targets.update({f"{REMOTE_TOOLS_DIR}/{tool}": False for tool in TOOLS.values()})
    return targets


def remote_name(host_id: str, prepared: PreparedFile) -> str:
    """A prepared file's name in the host's remote directory: its path without the `<host-id>/` prefix."""
    return prepared.path.removeprefix(f"{host_id}/")


def load_manifest(run_dir: Path) -> DeploymentManifest:
    """Read `<run>/manifest.json`; problems name the file and field, never a value."""
    path = run_dir / MANIFEST_FILE
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError([f"{path}: not found; {FIX}"]) from None
    except (OSError, ValueError) as exc:
        raise InputError([f"{path}: not a readable JSON manifest ({type(exc).__name__}); {FIX}"]) from None
    version = raw.get("schema_version") if isinstance(raw, dict) and raw.get("schema") == MANIFEST_SCHEMA else None
    if isinstance(version, int) and version != PREPARED_FORMAT:
        raise InputError([f"{run_dir}: prepared with format {version}, re-run prepare (this version reads format "
                          f"{PREPARED_FORMAT}: `deploy-hosts prepare`)"])  # fmt: skip
    try:
        return DeploymentManifest.model_validate(raw)
    except ValidationError as exc:
        raise InputError(
            [f"{path}: {'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in exc.errors()]
        ) from None


def verify_manifest(
    run_dir: Path, manifest: DeploymentManifest, inventory: Inventory, current: Mapping[str, CurrentAccess]
) -> None:
    """Raise one InputError naming every way the prepared run differs from the current checkout and files."""
    where = run_dir / MANIFEST_FILE
    problems = [f"{where}: {problem}; {fix}" for problem, fix in _host_problems(manifest, inventory, current)]
    problems += [f"{problem}; {FIX}" for problem in _file_problems(run_dir, manifest)]
    raise_if(problems)


def _host_problems(
    manifest: DeploymentManifest, inventory: Inventory, current: Mapping[str, CurrentAccess]
) -> list[tuple[str, str]]:
    """Each problem with its fix."""
    problems: list[tuple[str, str]] = []
    pinned = {host.id: host for host in manifest.hosts}
    for entry in inventory.hosts:
        host = pinned.get(entry.id)
        if host is None:
            problems.append((f"hosts: inventory host {entry.id} is not in the prepared run", FIX))
            continue
        problems += [(problem, FIX) for problem in _entry_problems(host, entry)]
        access = _access_problem(host, entry, current.get(entry.id))
        if access:
            problems.append(access)
    problems += [(f"hosts: {host_id} is not in the current inventory", FIX) for host_id in pinned if
                 host_id not in {e.id for e in inventory.hosts}]  # fmt: skip
    if [h.id for h in manifest.hosts if h.id in inventory.host_ids()] != [
        h for h in inventory.host_ids() if h in pinned
    ]:
        problems.append(("hosts: the order differs from the current inventory", FIX))
    return problems


def _access_problem(host: ManifestHost, entry: HostEntry, access: CurrentAccess | None) -> tuple[str, str] | None:
    """The destination, else the pinned keys, with the fix. Keys are compared only for an unchanged destination:
    the store's keys for another endpoint say nothing about a key change."""
    label = f"hosts[{host.id}]"
    if access is None or access.destination_sha256 is None:
        return f"{label}: {entry.ssh_env} is unset now", FIX
    if access.destination_sha256 != host.destination_sha256:
        return (f"{label}.destination_sha256: the destination in {entry.ssh_env} changed since this run was "
                "prepared", REDISCOVER_FIX)  # fmt: skip
    if sorted(set(access.fingerprints)) != sorted(set(host.host_key_fingerprints)):
        return f"{label}.host_key_fingerprints: differ from the keys pinned in the known-hosts store now", FIX
    return None


def _entry_problems(host: ManifestHost, entry: HostEntry) -> list[str]:
    label = f"hosts[{host.id}]"
    problems = [
        f"{label}.{name}: differs from the current inventory"
        for name, pinned, now in (
            ("ssh_env", host.ssh_env, entry.ssh_env),
            ("password_env", host.password_env, entry.password_env),
            ("roles", host.roles, entry.roles),
        )
        if pinned != now
    ]
    targets = {f.install_to: f.keep_if_present for f in host.files if f.install_to is not None}
    expected = expected_targets(host.roles)
    for target in sorted(expected.keys() - targets.keys()):
        problems.append(f"{label}.files: nothing is installed to {target}, which its roles need")
    for target in sorted(targets.keys() - expected.keys()):
        problems.append(f"{label}.files: {target} is not a file its roles need")
    for target in sorted(expected.keys() & targets.keys()):
        if expected[target] != targets[target]:
            problems.append(f"{label}.files: {target}: keep_if_present must be {str(expected[target]).lower()}")
    names = [remote_name(host.id, f) for f in host.files]
    problems += [f"{label}.files: {f.path} is not under {host.id}/" for f in host.files if
                 not f.path.startswith(f"{host.id}/")]  # fmt: skip
    problems += [f"{label}.files: {f.path} has no install_to" for f in host.files if f.install_to is None]
    if len(set(names)) != len(names) or BUNDLE_FILE in names:
        problems.append(f"{label}.files: two files share a remote name")
    return problems


def _file_problems(run_dir: Path, manifest: DeploymentManifest) -> list[str]:
    """Every pinned file must be a regular file (no symlink) with the pinned size and SHA-256."""
    problems = []
    if manifest.bundle.path != BUNDLE_FILE:
        problems.append(f"{run_dir / MANIFEST_FILE}: bundle.path must be {BUNDLE_FILE}")
    pinned = [manifest.bundle, *([manifest.sources] if manifest.sources else [])]
    for prepared in [*pinned, *(f for host in manifest.hosts for f in host.files)]:
        path = run_dir / prepared.path
        problem = _prepared_file_problem(path, prepared)
        if problem:
            problems.append(f"{path}: {problem}")
    return problems


def _prepared_file_problem(path: Path, prepared: PreparedFile) -> str | None:
    try:
        # O_NONBLOCK: opening a fifo planted here must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "not a regular file (or unreadable)"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if info.st_size != prepared.size:
            return f"size {info.st_size} differs from the pinned {prepared.size}"
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return None if digest.hexdigest() == prepared.sha256 else "content differs from its pinned SHA-256"

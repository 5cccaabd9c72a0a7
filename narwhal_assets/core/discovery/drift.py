"""Drift: what a cheap re-probe of a host saw, compared with the latest discovery's observations. Pure.

The drift probe reads only what identifies a host and what the generated config set depends on: the host
key and machine id, the engine image id, each model's `config.json` SHA-256, every checkpoint file's size, mtime and
inode (never its bytes), the GPU inventory and the fabric interfaces' addresses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import Field

from narwhal_assets.core.discovery.observations import CheckpointDigest, Gpu, HostObservation, NetInterface
from narwhal_assets.core.display import printable
from narwhal_assets.core.records import Record

HOST_KEY = "host-key"
MACHINE_ID = "machine-id"
INVENTORY = "inventory"
IMAGE = "image"
GPUS = "gpus"
FABRIC = "fabric"
MODEL_CONFIG = "model-config"
CHECKPOINT = "checkpoint"
PROBE = "probe"
CHECKED = ("host key", "machine id", "engine image id", "model config.json SHA-256",
           "checkpoint files' size/mtime/inode", "GPU inventory", "fabric addresses")  # fmt: skip
NAMED_PATHS = 3


class FileStat(Record):
    size: int
    mtime_ns: int
    inode: int


class ModelStat(Record):
    """One engine's model directory as the drift probe saw it."""

    model_dir: str
    config_sha256: str | None = None
    bytes_read: int = 0
    files: dict[str, FileStat] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)


class DriftSnapshot(Record):
    """One host's drift probe result, parsed; `problems` are tool failures (each one line naming the tool)."""

    host_id: str
    host_key_fingerprint: str
    machine_id: str | None = None
    image_id: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    fabric: dict[str, list[str]] = Field(default_factory=dict)
    models: dict[str, ModelStat] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Change:
    """One thing that drifted on a host: its kind (a tag-safe word) and a secret-free detail line."""

    kind: str
    detail: str


@dataclass
class DriftReport:
    """Every inventory host's outcome: drift (changes), unreachable (one line), or unchanged."""

    run_dir: str
    drift: dict[str, list[Change]] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    files_checked: int = 0
    bytes_read: int = 0

    def tags(self) -> dict[str, str]:
        """`narwhal/drift.<host-id>`: the drifted kinds, comma-separated."""
        return {f"narwhal/drift.{host}": ",".join(sorted({c.kind for c in changes}))
                for host, changes in sorted(self.drift.items())}  # fmt: skip

    def run_key(self) -> str:
        """Same drift, same key: a drift that discovery cannot fix launches one run, not one per tick."""
        listing = {host: sorted(f"{c.kind}: {c.detail}" for c in changes) for host, changes in self.drift.items()}
        return "drift-" + hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()[:32]

    def lines(self) -> list[str]:
        """One line per drifted or unreachable host."""
        drifted = [f"{host}: {c.kind}: {c.detail}" for host, changes in sorted(self.drift.items()) for c in changes]
        return drifted + [f"{host}: not checked: {why}" for host, why in sorted(self.unreachable.items())]

    def checked(self) -> str:
        """What was compared, for a skip message the operator can trust."""
        hosts = ", ".join(sorted(self.unchanged)) or "no host"
        counts = f"{self.files_checked} checkpoint files statted, {self.bytes_read} bytes of config.json read"
        return f"no drift on {hosts} against {self.run_dir}: checked {', '.join(CHECKED)} ({counts})"


def fabric_addresses(interfaces: Iterable[NetInterface], names: Iterable[str]) -> dict[str, list[str]]:
    """Global addresses of each named interface (sorted); an interface that is missing maps to []."""
    by_name = {i.name: i for i in interfaces}
    return {
        name: sorted(a.address for a in by_name[name].addresses if a.scope == "global") if name in by_name else []
        for name in sorted(set(names))
    }


def compare_host(
    observation: HostObservation, digests: Mapping[str, CheckpointDigest], snapshot: DriftSnapshot
) -> list[Change]:
    """Every difference between the latest observation of a host and its drift snapshot."""
    changes = [Change(PROBE, printable(problem)) for problem in snapshot.problems]
    if snapshot.host_key_fingerprint != observation.host_key_fingerprint:
        changes.append(Change(HOST_KEY, f"{observation.host_key_fingerprint} -> {snapshot.host_key_fingerprint}"))
    if snapshot.machine_id != observation.machine_id:
        seen = printable(snapshot.machine_id) if snapshot.machine_id else "unreadable"
        changes.append(Change(MACHINE_ID, f"{observation.machine_id} -> {seen} (another machine at this address?)"))
    observed_image = observation.image.id if observation.image else None
    if snapshot.image_id != observed_image:
        changes.append(Change(IMAGE, f"{observed_image} -> {snapshot.image_id}"))
    changes += _gpu_changes(observation.gpus, snapshot.gpus)
    observed_fabric = fabric_addresses(observation.interfaces, snapshot.fabric)
    for name, addresses in snapshot.fabric.items():
        if addresses != observed_fabric[name]:
            changes.append(Change(FABRIC, f"{name}: {_listing(observed_fabric[name])} -> {_listing(addresses)}"))
    for engine in sorted(set(digests) | set(snapshot.models)):
        changes += _model_changes(engine, observation, digests.get(engine), snapshot.models.get(engine))
    return changes


def _listing(values: list[str]) -> str:
    return ", ".join(values) if values else "none"


def _gpu_changes(observed: list[Gpu], seen: list[Gpu]) -> list[Change]:
    if observed == seen:
        return []
    if len(observed) != len(seen):
        return [Change(GPUS, f"{len(observed)} GPUs -> {len(seen)} GPUs")]
    moved = [f"GPU {a.index}" for a, b in zip(observed, seen, strict=True) if a != b]
    return [Change(GPUS, f"{', '.join(moved)} changed (uuid, name, memory or PCI bus id)")]


def _model_changes(
    engine: str, observation: HostObservation, digest: CheckpointDigest | None, seen: ModelStat | None
) -> list[Change]:
    if digest is None or seen is None:
        return [Change(CHECKPOINT, f"{engine}: {'not probed' if seen is None else 'no checkpoint in the discovery'}")]
    changes = [Change(CHECKPOINT, f"{engine}: {printable(problem)}") for problem in seen.problems]
    model = observation.models.get(engine)
    if model is not None and seen.config_sha256 != model.config_sha256:
        changes.append(Change(MODEL_CONFIG, f"{engine}: config.json {model.config_sha256} -> {seen.config_sha256}"))
    before = {f.path: FileStat(size=f.size, mtime_ns=f.mtime_ns, inode=f.inode) for f in digest.files}
    added = sorted(set(seen.files) - set(before))
    removed = sorted(set(before) - set(seen.files))
    modified = sorted(p for p in set(before) & set(seen.files) if before[p] != seen.files[p])
    for label, paths in (("changed", modified), ("added", added), ("removed", removed)):
        if paths:
            more = f" and {len(paths) - NAMED_PATHS} more" if len(paths) > NAMED_PATHS else ""
            named = ", ".join(printable(p) for p in paths[:NAMED_PATHS]) + more
            changes.append(Change(CHECKPOINT, f"{engine}: {len(paths)} file(s) {label}: {named}"))
    return changes

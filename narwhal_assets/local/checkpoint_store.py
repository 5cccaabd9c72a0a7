"""Checkpoint records on disk: per-file tables stored once, content-addressed, and old runs pruned.

`runs/discovery/<run>/engine-<n>-checkpoint.json` (a CheckpointRecord) names its per-file table by the
SHA-256 of the table's bytes, stored as `runs/discovery/objects/<sha256>.json` (a CheckpointFiles). An
unchanged tree produces the same table every run, so re-discovery adds a small record instead of
megabytes. Records written before this layout (schema_version 1, table embedded) still load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from narwhal_assets.core.discovery.digests import verify_digest
from narwhal_assets.core.discovery.observations import CheckpointDigest, CheckpointFiles, CheckpointRecord
from narwhal_assets.core.discovery.retention import RunInfo, objects_to_remove, runs_to_remove
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.jsonfile import load_json_model, render_json
from narwhal_assets.local.privatefiles import ensure_private_dir, sha256_file, write_private

OBJECTS_DIR = "objects"
MANIFEST = "manifest.json"
CHECKPOINT_GLOB = "engine-*-checkpoint.json"
GRACE_S = 2 * 3600.0  # longer than any discovery may run: younger incomplete runs and objects may be in use

__all__ = ["OBJECTS_DIR", "load_checkpoint", "objects_dir", "prune_discovery_runs", "save_checkpoint"]


def objects_dir(discovery_dir: Path) -> Path:
    return discovery_dir / OBJECTS_DIR


def _object_path(record_path: Path, sha256: str) -> Path:
    return objects_dir(record_path.parent.parent) / f"{sha256}.json"


def _store_object(path: Path, text: str, sha256: str) -> None:
    """Write the object unless an intact copy is already there (a damaged one is replaced)."""
    if path.is_file() and sha256_file(path) == sha256:
        os.utime(path)  # fresh again: pruning spares objects that a run in progress refers to
        return
    write_private(path, text)


def save_checkpoint(path: Path, digest: CheckpointDigest) -> str:
    """Write `path` (in a run directory) as a CheckpointRecord whose table goes to `<discovery>/objects/`.

    The object is written before the record, so a record never names a missing object. Returns the
    record's SHA-256, like `write_private`.
    """
    table = CheckpointFiles(files=digest.files).model_dump_json(by_alias=True) + "\n"
    sha256 = hashlib.sha256(table.encode("utf-8")).hexdigest()
    ensure_private_dir(objects_dir(path.parent.parent))
    _store_object(_object_path(path, sha256), table, sha256)
    fields = digest.model_dump(exclude={"schema_", "schema_version", "files"})
    record = CheckpointRecord(**fields, file_count=len(digest.files), files_object=sha256)
    return write_private(path, render_json(record))


def load_checkpoint(path: Path) -> CheckpointDigest:
    """The digest of a record (either layout), with its table checked against the name and the tree digest."""
    try:
        version = json.loads(path.read_text(encoding="utf-8")).get("schema_version")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise InputError([f"{path}: not readable JSON ({type(exc).__name__})"]) from None
    if version == 1:
        digest = load_json_model(path, CheckpointDigest)
    else:
        record = load_json_model(path, CheckpointRecord)
        digest = CheckpointDigest(
            **record.model_dump(exclude={"schema_", "schema_version", "file_count", "files_object"}),
            files=_load_table(path, record).files,
        )
    verify_digest(digest)
    return digest


def _load_table(path: Path, record: CheckpointRecord) -> CheckpointFiles:
    table_path = _object_path(path, record.files_object)
    try:
        raw = table_path.read_bytes()
    except OSError as exc:
        raise InputError([f"{path}: files_object {table_path.name}: {exc.strerror or exc}"]) from None
    if hashlib.sha256(raw).hexdigest() != record.files_object:
        raise InputError([f"{table_path}: content does not match its name (damaged object)"])
    try:
        table = CheckpointFiles.model_validate_json(raw)
    except ValidationError:
        raise InputError([f"{table_path}: not a checkpoint file table"]) from None
    if len(table.files) != record.file_count:
        raise InputError([f"{path}: file_count {record.file_count} but {table_path.name} lists {len(table.files)}"])
    return table


def _runs(discovery_dir: Path) -> Iterator[RunInfo]:
    for run_dir in sorted(discovery_dir.iterdir()):
        if run_dir.name == OBJECTS_DIR or run_dir.name.startswith(".") or not run_dir.is_dir():
            continue
        manifest = run_dir / MANIFEST
        complete = manifest.is_file()
        started = run_dir.name.split("-", 1)[0]
        activity = max(_mtime(p) for p in (run_dir, *run_dir.rglob("*")))
        order = (started, manifest.stat().st_mtime_ns if complete else 0, run_dir.name)
        yield RunInfo(name=run_dir.name, complete=complete, order=order, last_activity=activity)


def _mtime(path: Path) -> float:
    """A file that vanished while listing (a temp file renamed into place) counts as no activity: the
    rename itself updated its directory's mtime."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> bool:
    """Best effort: a run or object that cannot be removed now is tried again after the next publish."""
    try:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    except OSError:
        return False
    return True


def _referenced(run_dir: Path) -> set[str]:
    """Objects named by a run's records; an unreadable record protects nothing and is left alone."""
    names = set()
    for record in run_dir.glob(CHECKPOINT_GLOB):
        try:
            name = json.loads(record.read_text(encoding="utf-8")).get("files_object")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(name, str):
            names.add(name)
    return names


def prune_discovery_runs(discovery_dir: Path, keep: int, current: str | None, now: float | None = None) -> list[Path]:
    """Delete old runs (see `narwhal_assets.core.discovery.retention`) and objects no remaining run refers to.

    Call it under the publish lock, after a run published: `current` is that run's directory name (the
    one the config set now comes from). Returns what was deleted; what could not be deleted (a file
    system error) stays for the next time, since the published set does not depend on it.
    """
    if not discovery_dir.is_dir():
        return []
    stale_before = (time.time() if now is None else now) - GRACE_S
    names = runs_to_remove(list(_runs(discovery_dir)), keep, current, stale_before)
    removed = [path for path in (discovery_dir / name for name in names) if _remove(path)]
    store = objects_dir(discovery_dir)
    if store.is_dir():
        objects = {p.stem: _mtime(p) for p in store.glob("*.json")}
        referenced = {name for run in discovery_dir.iterdir() if run.is_dir() for name in _referenced(run)}
        stale = [store / f"{name}.json" for name in objects_to_remove(objects, referenced, stale_before)]
        removed += [path for path in stale if _remove(path)]
    return removed

"""Checkpoint records on disk: tables stored once by content, checked on load, old runs and objects pruned."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from narwhal_assets.core.discovery.digests import model_tree_digest, tree_digest
from narwhal_assets.core.discovery.observations import CheckpointDigest, CheckpointFile
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.local.checkpoint_store import load_checkpoint, objects_dir, prune_discovery_runs, save_checkpoint

OLD = time.time() - 3 * 24 * 3600


def table(count: int, salt: str = "") -> list[CheckpointFile]:
    return [
        CheckpointFile(
            path=f"part/{n:05d}.bin",
            size=n,
            sha256=hashlib.sha256(f"{salt}{n}".encode()).hexdigest(),
            mtime_ns=1_700_000_000_000_000_000 + n,
            inode=1000 + n,
        )
        for n in range(count)
    ]


def digest(engine: str, files: list[CheckpointFile], reused: int = 0) -> CheckpointDigest:
    return CheckpointDigest(
        engine=engine,
        host_id="node-1",
        model_dir="/srv/models/m",
        files=files,
        tree_sha256=tree_digest(files),
        model_tree_sha256=model_tree_digest(files),
        bytes_hashed=sum(f.size for f in files[reused:]),
        bytes_reused=sum(f.size for f in files[:reused]),
        files_reused=reused,
    )


def new_run(discovery: Path, name: str, complete: bool = True, files: list[CheckpointFile] | None = None) -> Path:
    run_dir = discovery / name
    run_dir.mkdir(parents=True)
    if files is not None:
        save_checkpoint(run_dir / "engine-1-checkpoint.json", digest("engine-1", files))
    if complete:
        (run_dir / "manifest.json").write_text("{}\n")
    for path in (run_dir, *run_dir.rglob("*")):
        os.utime(path, (OLD, OLD))
    return run_dir


def test_an_unchanged_table_is_stored_once_and_every_record_loads_back(tmp_path: Path) -> None:
    files = table(2000)
    first = new_run(tmp_path, "20261201T000000Z-aaaaaa", files=files)
    second = new_run(tmp_path, "20261201T010000Z-bbbbbb", files=files)
    first_record, second_record = (run / "engine-1-checkpoint.json" for run in (first, second))
    assert first_record.read_bytes() == second_record.read_bytes()
    assert len(list(objects_dir(tmp_path).iterdir())) == 1
    record = json.loads(second_record.read_text())
    assert "files" not in record and record["file_count"] == 2000 and record["schema_version"] == 2
    assert record["model_tree_sha256"] == model_tree_digest(files)  # the serving fleet's digest, beside ours
    stored = objects_dir(tmp_path) / f"{record['files_object']}.json"
    assert second_record.stat().st_size < 1024 < stored.stat().st_size
    assert load_checkpoint(second_record) == digest("engine-1", files)
    changed = new_run(tmp_path, "20261201T020000Z-cccccc", files=table(2000, salt="new"))
    assert len(list(objects_dir(tmp_path).iterdir())) == 2
    assert load_checkpoint(changed / "engine-1-checkpoint.json").files == table(2000, salt="new")


def test_records_and_objects_are_private(tmp_path: Path) -> None:
    run_dir = new_run(tmp_path, "20261201T000000Z-aaaaaa", files=table(3))
    for path in (objects_dir(tmp_path), *objects_dir(tmp_path).iterdir(), run_dir / "engine-1-checkpoint.json"):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path


def test_a_record_written_before_content_addressing_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "run" / "engine-2-checkpoint.json"
    path.parent.mkdir()
    path.write_text(render_json(digest("engine-2", table(5))))
    assert load_checkpoint(path) == digest("engine-2", table(5))


def test_a_damaged_or_missing_object_and_an_inconsistent_digest_are_errors_naming_the_file(tmp_path: Path) -> None:
    record = new_run(tmp_path, "20261201T000000Z-aaaaaa", files=table(4)) / "engine-1-checkpoint.json"
    name = json.loads(record.read_text())["files_object"]
    stored = objects_dir(tmp_path) / f"{name}.json"
    stored.write_text(stored.read_text().replace('"size":3', '"size":4'))
    with pytest.raises(InputError, match=f"{stored}: content does not match its name"):
        load_checkpoint(record)
    stored.unlink()
    with pytest.raises(InputError, match=f"{record}: files_object {name}.json: No such file"):
        load_checkpoint(record)
    save_checkpoint(record, digest("engine-1", table(4)).model_copy(update={"tree_sha256": "0" * 64}))
    with pytest.raises(InputError, match="tree_sha256 does not match its file list"):
        load_checkpoint(record)


def test_a_damaged_object_is_replaced_when_the_same_table_is_saved_again(tmp_path: Path) -> None:
    record = new_run(tmp_path, "20261201T000000Z-aaaaaa", files=table(4)) / "engine-1-checkpoint.json"
    stored = objects_dir(tmp_path) / f"{json.loads(record.read_text())['files_object']}.json"
    stored.write_text("{}")
    save_checkpoint(record, digest("engine-1", table(4)))
    assert load_checkpoint(record).files == table(4)


def test_pruning_keeps_the_newest_runs_and_the_current_one_and_drops_unreferenced_objects(tmp_path: Path) -> None:
    names = [f"20261201T0{n}0000Z-{n:06d}" for n in range(6)]
    for n, name in enumerate(names):
        new_run(tmp_path, name, files=table(10, salt=str(n % 3)))
    failed = new_run(tmp_path, "20261130T000000Z-ffffff", complete=False, files=table(10, salt="failed"))
    os.utime(objects_dir(tmp_path), (OLD, OLD))
    for stored in objects_dir(tmp_path).iterdir():
        os.utime(stored, (OLD, OLD))
    fresh = objects_dir(tmp_path) / f"{'f' * 64}.json"  # a run in progress wrote it a moment ago
    fresh.write_text("{}")

    removed = prune_discovery_runs(tmp_path, keep=2, current=names[1])

    remaining = sorted(p.name for p in tmp_path.iterdir() if p.name != "objects")
    assert remaining == [names[1], names[4], names[5]]
    assert not failed.exists() and tmp_path / names[0] in removed
    records = [json.loads((tmp_path / n / "engine-1-checkpoint.json").read_text()) for n in remaining]
    referenced = {record["files_object"] for record in records}
    assert {p.stem for p in objects_dir(tmp_path).iterdir()} == referenced | {"f" * 64}
    for name in remaining:
        assert load_checkpoint(tmp_path / name / "engine-1-checkpoint.json").files
    assert prune_discovery_runs(tmp_path, keep=2, current=names[1]) == []


def test_pruning_a_missing_discovery_directory_does_nothing(tmp_path: Path) -> None:
    assert prune_discovery_runs(tmp_path / "none", keep=1, current=None) == []

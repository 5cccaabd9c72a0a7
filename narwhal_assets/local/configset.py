"""Publish the discovered config set all-or-nothing, by construction, even under SIGKILL.

The set is several files at operator-chosen paths, so no single rename can switch it. Instead:

1. every new file is written and fsynced beside its target under a temporary name, and every existing
   target gets a hard link as its backup;
2. a journal naming each (staged, target, backup) triple is written atomically: from here on the new set
   is committed;
3. the staged files are renamed over their targets, the run's manifest last;
4. the journal and backups are removed.

A failure before (2) leaves the previous set and removes the staged files. A failure during (3) in this
process rolls back from the backups. A crash after (2) leaves the journal, and the next command that opens
the checkout (`recover_publish`) completes the renames, or, if a rename cannot be completed, rolls every
target back; either way it holds the publish lock, so no reader sees the set mid-change.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from narwhal_assets.core.errors import PublishError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.privatefiles import FILE_MODE, ensure_private_dir, exclusive_lock, write_private

JOURNAL = ".publish-journal.json"
PUBLISH_LOCK = ".publish.lock"
# Held while targets are being replaced, so a signal handler can let the switch finish before exiting;
# PUBLISHED lists the run directories whose sets this process published (for the final report).
PUBLISHING = threading.Lock()
PUBLISHED: list[Path] = []


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    staged: str
    backup: str | None


class Journal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = 1
    run_dir: str
    steps: list[Step]


@contextlib.contextmanager
def publish_lock(settings: Settings) -> Iterator[None]:
    """Serialises publishers with each other and with crash recovery."""
    with exclusive_lock(settings.discovery_dir / PUBLISH_LOCK):
        yield


def publish_files(settings: Settings, run_dir: Path, files: Mapping[Path, bytes]) -> None:
    """Replace every file in `files` together (the caller holds `publish_lock`); the last entry lands last."""
    _recover_locked(settings)
    tag = f"{run_dir.name}.{os.getpid()}"
    steps: list[Step] = []
    try:
        for target, data in files.items():
            ensure_private_dir(target.parent)
            staged = target.with_name(f".{target.name}.{tag}.new")
            _write_synced(staged, data)
            backup = None
            if target.exists():
                backup = str(target.with_name(f".{target.name}.{tag}.old"))
                os.link(target, backup)
            steps.append(Step(target=str(target), staged=str(staged), backup=backup))
        write_private(_journal_path(settings), Journal(run_dir=str(run_dir), steps=steps).model_dump_json())
    except BaseException:
        _discard(files, tag)
        raise
    with PUBLISHING:
        current = ""
        try:
            for step in steps:
                current = step.target
                os.replace(step.staged, step.target)
        except BaseException as exc:
            _roll_back(steps)
            _journal_path(settings).unlink()
            if isinstance(exc, OSError):
                raise PublishError(
                    f"could not replace {current}: {exc.strerror}; the previous config set is unchanged"
                ) from None
            raise
        _finish(settings, steps)
        PUBLISHED.append(run_dir)


def recover_publish(settings: Settings) -> bool:
    """Complete (or roll back) a publish a crash interrupted; True when there was one."""
    if not _journal_path(settings).exists():
        return False
    with publish_lock(settings):
        return _recover_locked(settings)


def _recover_locked(settings: Settings) -> bool:
    path = _journal_path(settings)
    try:
        journal = Journal.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return False
    try:
        for step in journal.steps:
            if os.path.exists(step.staged):
                os.replace(step.staged, step.target)
    except OSError:
        _roll_back(journal.steps)
        path.unlink()
        raise PublishError(
            f"an interrupted publish of {journal.run_dir} could not be completed and was rolled back; "
            "the previous config set is in place"
        ) from None
    _finish(settings, journal.steps)
    return True


def _roll_back(steps: list[Step]) -> None:
    """Put every target back as it was: its backup link, or absent when it did not exist before."""
    for step in steps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(step.staged)
        if step.backup is not None:
            with contextlib.suppress(FileNotFoundError):
                os.replace(step.backup, step.target)
                os.unlink(step.backup)  # rename(2) does nothing when both names link one file: not replaced yet
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(step.target)


def _finish(settings: Settings, steps: list[Step]) -> None:
    for step in steps:
        if step.backup is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(step.backup)
    _journal_path(settings).unlink()


def _discard(files: Mapping[Path, bytes], tag: str) -> None:
    """Remove what a publish that never committed left behind (staged files and backup links)."""
    for target in files:
        for suffix in ("new", "old"):
            with contextlib.suppress(FileNotFoundError):
                target.with_name(f".{target.name}.{tag}.{suffix}").unlink()


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _journal_path(settings: Settings) -> Path:
    return settings.discovery_dir / JOURNAL

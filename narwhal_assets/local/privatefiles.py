"""Private files: mode 0600 in 0700 directories, written atomically (temp file, fsync, rename)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def ensure_private_dir(path: Path) -> Path:
    """Create `path` and each missing parent as 0700; an existing leaf directory is tightened to 0700."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def write_private(path: Path, data: bytes | str) -> str:
    """Atomically replace `path` with `data` at mode 0600; returns the content's SHA-256 hex digest."""
    return _write_into_place(path, data, os.replace)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (a private, empty file) for the duration of the block."""
    ensure_private_dir(lock_path.parent)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_exclusive(path: Path, data: bytes | str) -> str:
    """Create `path` with `data` at mode 0600, refusing an existing file (prepared inputs are never replaced).

    The content is linked into place from a temporary name, so a reader never sees a partial file and an
    existing file (or symlink) at `path` makes this fail with `FileExistsError`.
    """
    return _write_into_place(path, data, os.link)


def _write_into_place(path: Path, data: bytes | str, place: Callable[[Path, Path], None]) -> str:
    """Write `data` to a private temporary file beside `path`, fsync it, then `place(tmp, path)`."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    ensure_private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        place(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # gone already after a replace; the spare name after a link
    return hashlib.sha256(raw).hexdigest()


def non_private(paths: Iterable[Path]) -> list[str]:
    """One line per file or directory under `paths` that is not private, in walk order: the one rule for
    "is this tree private" (generated files, the Dagster instance, prepared runs before they are installed).

    Private means owned by this process's user (the operator) and no group or other permission bit (what
    0600 files in 0700 directories give): nobody else can have written or read it. Directories are walked;
    symlinks are skipped, never followed (their own mode means nothing, their target is outside the tree);
    a missing path is skipped. Pure: reports, changes nothing.
    """
    problems: list[str] = []
    uid = os.getuid()
    for path in (p for top in paths for p in _tree(top)):
        try:
            info = path.lstat()
        except FileNotFoundError:  # removed while walking (a finishing run's temporary file)
            continue
        if stat.S_ISLNK(info.st_mode):
            continue
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            want = DIR_MODE if stat.S_ISDIR(info.st_mode) else FILE_MODE
            problems.append(f"{path}: mode {mode:04o}, expected {want:04o}")
        if info.st_uid != uid:
            problems.append(f"{path}: owned by uid {info.st_uid}, not by this user (uid {uid})")
    return problems


def _tree(top: Path) -> Iterator[Path]:
    """`top` and, for a directory, everything below it, sorted per directory (symlinks not followed)."""
    if not os.path.lexists(top):
        return
    yield top
    if top.is_dir() and not top.is_symlink():
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            yield from (Path(directory) / name for name in [*dirs, *sorted(files)])

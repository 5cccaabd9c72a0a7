"""Checkpoint tree digests: one SHA-256 that names a model directory's exact bytes.

Definition: take every regular file under the directory (symlinks to files followed) except Hugging Face's
download metadata under a top-level `.cache/huggingface/` (when and how a replica was fetched, not what it
serves), write one line
`<sha256 hex><two spaces><relative POSIX path>\\n` per file, sort the lines by the path's UTF-8 bytes, and
hash the concatenation with SHA-256. That is byte for byte what

    cd DIR && find -L . -path ./.cache/huggingface -prune -o -type f -printf '%P\\0' | LC_ALL=C sort -z |
        xargs -0 sha256sum -- | sha256sum

prints, so an operator can recompute it on any host without this package. (`--` matters: without it a
top-level file named like `-z` is taken for an option.) Paths containing a newline or a backslash are
refused because `sha256sum` escapes them, and a top-level file named `-` because it reads stdin instead.

The serving fleet's own checkpoint manifest names the same files by another digest, `model_tree_sha256`
(`model_tree_digest`): the SHA-256 of the compact JSON array of `{"path", "sha256", "size"}` objects (keys
sorted, ASCII-escaped), ordered by path component. Discovery records both, so a replica can be compared
with either tool's records.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from narwhal_assets.core.discovery.observations import CheckpointDigest, CheckpointFile
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.records import SHA256_RE

# Substrings of "\0" + "\0".join(paths) + "\0" that only a path `_check_entry` refuses can produce.
_BAD_PARTS = ("\n", "\\", "//", "\0\0", "\0-\0", "\0/", "\0./", "/\0")
_HASH_LINES_RE = re.compile(r"(?:[0-9a-f]{64}\n)*")

__all__ = ["compare_replicas", "first_difference", "model_tree_digest", "tree_digest", "tree_listing", "verify_digest"]


def _sort_key(path: str) -> bytes:
    return path.encode("utf-8")


def _check_entry(path: str, sha256: str) -> None:
    if not path or path == "-" or path.startswith("/") or "\n" in path or "\\" in path:
        raise ValueError(f"checkpoint path {path!r} cannot be listed verbatim in a tree digest")
    if path.startswith("./") or "//" in path or path.endswith("/"):
        raise ValueError(f"checkpoint path {path!r} is not a normalised relative path")
    if not SHA256_RE.fullmatch(sha256):
        raise ValueError(f"checkpoint path {path!r}: sha256 is not 64 lowercase hex digits")


def tree_listing(files: Iterable[CheckpointFile]) -> bytes:
    """The `sha256sum` lines the tree digest hashes, in digest order (useful to diff two replicas).

    Every entry is checked at once on the joined paths and hashes (a table has tens of thousands of
    rows); a single entry is looked at only to name the one that failed.
    """
    rows = [(f.path, f.sha256) for f in files]
    joined = "\0" + "\0".join(path for path, _ in rows) + "\0"
    hashes = "".join(sha256 + "\n" for _, sha256 in rows)
    if any(part in joined for part in _BAD_PARTS) or not _HASH_LINES_RE.fullmatch(hashes):
        for path, sha256 in rows:
            _check_entry(path, sha256)
    entries = dict(rows)
    if len(entries) != len(rows):
        twice = next(path for path, count in Counter(path for path, _ in rows).items() if count > 1)
        raise ValueError(f"checkpoint path {twice!r} listed twice")
    # Plain str order is UTF-8 byte order; a string that cannot be UTF-8 fails the encode (a ValueError).
    return "".join(f"{entries[path]}  {path}\n" for path in sorted(entries)).encode("utf-8")


def tree_digest(files: Iterable[CheckpointFile]) -> str:
    """SHA-256 hex of `tree_listing(files)`; see the module docstring for the shell equivalent."""
    return hashlib.sha256(tree_listing(files)).hexdigest()


def model_tree_digest(files: Iterable[CheckpointFile]) -> str:
    """The serving fleet's `model_tree_sha256` of the same files (see the module docstring)."""
    rows = sorted(({"path": f.path, "sha256": f.sha256, "size": f.size} for f in files),
                  key=lambda row: str(row["path"]).split("/"))  # fmt: skip
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode("ascii")).hexdigest()


def verify_digest(digest: CheckpointDigest) -> None:
    """Raise when a stored digest's tree_sha256 (or model_tree_sha256) does not follow from its own file list."""
    where = f"checkpoint {digest.engine} on {digest.host_id}"
    actual = tree_digest(digest.files)
    if actual != digest.tree_sha256:
        raise InputError([f"{where}: tree_sha256 does not match its file list ({actual})"])
    if digest.model_tree_sha256 is not None and digest.model_tree_sha256 != model_tree_digest(digest.files):
        raise InputError([f"{where}: model_tree_sha256 does not match its file list"])


def first_difference(left: CheckpointDigest, right: CheckpointDigest) -> tuple[str, str] | None:
    """The first path (UTF-8 byte order) whose hash differs or that exists on one side only, and why."""
    a = {f.path: f.sha256 for f in left.files}
    b = {f.path: f.sha256 for f in right.files}
    for path in sorted(a.keys() | b.keys(), key=_sort_key):
        if path not in b:
            return path, f"missing on {right.engine}"
        if path not in a:
            return path, f"missing on {left.engine}"
        if a[path] != b[path]:
            return path, "content differs"
    return None


def _where(digest: CheckpointDigest) -> str:
    return f"{digest.engine} ({digest.host_id}:{digest.model_dir})"


def compare_replicas(digests: Mapping[str, CheckpointDigest]) -> None:
    """Raise InputError unless every engine serving one model has the identical checkpoint tree.

    Each engine is compared with the lowest-named one; every mismatch is reported at once, each naming
    both engines and the first differing path, so the operator knows which copy to fix.
    """
    if len(digests) < 2:
        return
    engines = sorted(digests)
    reference = digests[engines[0]]
    problems = []
    for engine in engines[1:]:
        other = digests[engine]
        if other.tree_sha256 == reference.tree_sha256:
            continue
        difference = first_difference(reference, other)
        detail = (
            f"first difference at {difference[0]!r} ({difference[1]})"
            if difference
            else "file lists agree, so a stored tree_sha256 is inconsistent"
        )
        problems.append(
            f"checkpoint replicas differ: {_where(reference)} tree {reference.tree_sha256[:12]} vs "
            f"{_where(other)} tree {other.tree_sha256[:12]}: {detail}"
        )
    if problems:
        raise InputError(problems)

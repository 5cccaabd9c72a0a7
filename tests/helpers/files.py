"""Reading and checking the files commands write, and replacing a file a host serves for a while."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def snapshot(directory: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file below `directory` (empty when it does not exist)."""
    if not directory.is_dir():
        return {}
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source_env(path: Path) -> dict[str, str]:
    """What bash sees after sourcing the file: every NARWHAL_* variable it defines."""
    script = '. "$1" && for v in ${!NARWHAL_@}; do printf "%s=%s\\n" "$v" "${!v}"; done'
    done = subprocess.run(["env", "-i", "bash", "-c", script, "bash", str(path)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def known_hosts_fingerprints(path: Path) -> dict[str, set[str]]:
    """Host field -> SHA256 fingerprints of the recorded keys, computed from the key blobs here."""
    found: dict[str, set[str]] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        host, _key_type, blob = line.split()[:3]
        digest = hashlib.sha256(base64.b64decode(blob)).digest()
        found.setdefault(host, set()).add("SHA256:" + base64.b64encode(digest).decode().rstrip("="))
    return found


def assert_nowhere(needles: list[str], roots: list[Path]) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path.name != ".env":
                data = path.read_bytes()
                for needle in needles:
                    assert needle.encode() not in data, f"{needle!r} found in {path}"


@contextmanager
def replaced_file(path: Path, content: bytes) -> Iterator[None]:
    """Overwrite a file in place (same inode, so the host's bind mount sees it), restoring it afterwards."""
    original, mode = path.read_bytes(), path.stat().st_mode & 0o7777
    try:
        path.write_bytes(content)
        yield
    finally:
        path.write_bytes(original)
        path.chmod(mode)

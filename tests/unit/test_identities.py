"""The keys a connection offers (`ssh/identities.py`): a private key file is parsed once per version of the
file, so many hosts cost one parse yet an edited or replaced key is always read again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import paramiko


def test_a_private_key_is_parsed_once_per_version_of_its_file(tmp_path: Path) -> None:
    """Loaded once per process for many hosts, yet a key rewritten or replaced in place, or protected by a
    passphrase since, is read again: what authenticates is always what the file holds now."""
    from narwhal_assets.ssh.identities import _private as _load_key

    def keygen(name: str, passphrase: str = "") -> Path:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(tmp_path / name)],
                       check=True)  # fmt: skip
        return tmp_path / name

    path, other, locked = keygen("id"), keygen("other"), keygen("locked", "secret")
    path = str(path)
    first = _load_key(path)
    assert first is not None and _load_key(path) is first, "the same file version is parsed once"
    expected = paramiko.PKey.from_path(other).fingerprint
    Path(path).write_bytes(other.read_bytes())  # rewritten in place: another key, the same size
    reloaded = _load_key(path)
    assert reloaded is not None and reloaded.fingerprint == expected != first.fingerprint
    os.replace(locked, path)  # renamed over it: a key that needs a passphrase is skipped
    assert _load_key(path) is None
    Path(path).unlink()
    assert _load_key(path) is None

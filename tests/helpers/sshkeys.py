"""Real OpenSSH keys and host certificates for known-hosts tests, made by `ssh-keygen`, and OpenSSH's own
hashed-name spelling (`|1|salt|hmac`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Key:
    """A key pair on disk; `line` is its public half as a known-hosts line writes it (`type base64`)."""

    path: Path

    @property
    def public(self) -> Path:
        return self.path.with_name(self.path.name + ".pub")

    @property
    def key_type(self) -> str:
        return self.public.read_text(encoding="ascii").split()[0]

    @property
    def blob(self) -> str:
        return self.public.read_text(encoding="ascii").split()[1]

    @property
    def line(self) -> bytes:
        return f"{self.key_type} {self.blob}".encode()


def make_key(directory: Path, name: str, kind: str = "ed25519") -> Key:
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(path)], check=True)
    return Key(path)


def sign_host(ca: Key, key: Key, name: str, *options: str) -> Key:
    """A host certificate for `key` signed by `ca` (e.g. `-n localhost -V -5m:+1d`), kept beside the key as
    `<key>-<name>-cert.pub`; returned as a Key whose public half is the certificate."""
    signed = key.path.with_name(f"{key.path.name}-{name}")
    signed.write_bytes(key.path.read_bytes())
    signed.chmod(0o600)
    signed.with_name(signed.name + ".pub").write_bytes(key.public.read_bytes())
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca.path), "-I", name, "-h", *options, str(signed) + ".pub"],
                   check=True)  # fmt: skip
    cert = signed.with_name(signed.name + "-cert.pub")
    cert.rename(signed.with_name(signed.name + ".pub"))
    return Key(signed)


def hashed(name: str, salt: bytes | None = None) -> bytes:
    """`name` as OpenSSH's HashKnownHosts writes it."""
    salt = os.urandom(20) if salt is None else salt
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return b"|1|" + base64.b64encode(salt) + b"|" + base64.b64encode(digest)

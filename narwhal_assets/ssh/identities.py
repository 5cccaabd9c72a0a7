"""The keys a connection offers, in OpenSSH's order (sshconnect2.c `pubkey_prepare`), from exactly the files
OpenSSH would read: the IdentityFile list of the `ssh -G` answer (its defaults only when the config names
none), each with its `<file>-cert.pub` certificate if there is one, CertificateFile certificates, and the
agent's keys.

Order: CertificateFile certificates first, then the agent's keys (a key that is also an IdentityFile is used
through the agent, in the agent's order; other agent keys only without IdentitiesOnly), then the remaining
IdentityFiles in order, each followed by its certificate; finally only the algorithms PubkeyAcceptedAlgorithms
allows. A certificate signs with the private key whose public key it certifies (an agent's or an
IdentityFile's). A file key is parsed once per process per version of the file, and only when its turn
comes: an encrypted key with no agent holding it is passed over, as OpenSSH does in batch mode.
"""

from __future__ import annotations

import base64
import functools
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.agent import AgentKey, AgentSSH

from narwhal_assets.ssh.policy import Refusal

CERT_MARK = "-cert-v01@openssh.com"
OPENSSH_PRIVATE = b"-----BEGIN OPENSSH PRIVATE KEY-----"
OPENSSH_MAGIC = b"openssh-key-v1\0"
MAX_KEY_FILE = 1 << 20
RSA_SIGNATURES = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
KEY_FIELDS = {"ssh-rsa": 2, "ssh-ed25519": 1}  # public key fields after the type name (ECDSA: 2)


def public_key(path: str) -> tuple[str, bytes] | None:
    """(type, blob) of the key in `path`, from `path.pub` or, without it, the private key file itself (an
    OpenSSH-format key carries its public key unencrypted); None when neither says."""
    found = _public_line(path + ".pub")
    if found is not None:
        return found
    data = _read(path)
    if data is None or not data.lstrip().startswith(OPENSSH_PRIVATE):
        key = _private(path)
        return (key.get_name(), key.asbytes()) if key is not None else None
    try:
        body = base64.b64decode(b"".join(data.strip().splitlines()[1:-1]))
        if not body.startswith(OPENSSH_MAGIC):
            return None
        offset = len(OPENSSH_MAGIC)
        for _ in range(3):  # cipher name, kdf name, kdf options
            offset += 4 + struct.unpack_from(">I", body, offset)[0]
        offset += 4  # number of keys
        size = struct.unpack_from(">I", body, offset)[0]
        blob = body[offset + 4 : offset + 4 + size]
        name_size = struct.unpack_from(">I", blob, 0)[0]
        return blob[4 : 4 + name_size].decode("ascii"), blob
    except (ValueError, struct.error, UnicodeDecodeError):
        return None


def certificate(path: str) -> tuple[str, bytes, bytes] | None:
    """(certificate type, certificate blob, the certified key's plain public blob) of a `-cert.pub` file."""
    found = _public_line(path)
    if found is None or not found[0].endswith(CERT_MARK):
        return None
    kind, blob = found
    plain = kind.removesuffix(CERT_MARK)
    fields = KEY_FIELDS.get(plain, 2 if plain.startswith("ecdsa-sha2-") else 0)
    message = paramiko.Message(blob)
    if not fields or message.get_string() != kind.encode():
        return None
    message.get_string()  # the nonce
    certified = paramiko.Message()
    certified.add_string(plain)
    for _ in range(fields):
        certified.add_string(message.get_string())
    return kind, blob, certified.asbytes()


def refusals(identity_files: Sequence[str]) -> list[Refusal]:
    """Security-key (`sk-`) identities: OpenSSH would ask the token to sign, which paramiko cannot."""
    found = []
    for path in identity_files:
        key = public_key(path) if os.path.exists(path) else None
        if key is not None and key[0].startswith("sk-"):
            found.append(Refusal("IdentityFile", path, f"a security-key ({key[0]}) identity: not supported"))
    return found


def implicit_certificates(identity_files: Sequence[str]) -> list[str]:
    """The `<IdentityFile>-cert.pub` files OpenSSH offers along with their keys."""
    return [path + "-cert.pub" for path in identity_files if certificate(path + "-cert.pub") is not None]


@dataclass(frozen=True)
class Offer:
    """One identity to try: a file key, an agent key, or a certificate (signed by `signer`)."""

    label: str
    kind: str  # the key or certificate type, as PubkeyAcceptedAlgorithms names it
    path: str | None = None
    agent_key: AgentKey | None = None
    cert_path: str | None = None
    certified: bytes | None = None  # a certificate's public key blob

    def key(self, offers: Sequence[Offer]) -> paramiko.PKey | None:
        """The paramiko key to authenticate with (None: nothing can sign for it)."""
        if self.cert_path is None:
            return self.agent_key if self.agent_key is not None else _private(self.path) if self.path else None
        signer = next((o for o in offers if o.cert_path is None and o.blob() == self.certified), None)
        base: paramiko.PKey | None = None
        if signer is not None and signer.agent_key is not None:
            base = AgentKey(signer.agent_key.agent, signer.agent_key.blob, signer.agent_key.comment)
        elif signer is not None and signer.path is not None and _private(signer.path) is not None:
            base = paramiko.PKey.from_path(signer.path)  # a fresh object: a certificate is attached to it
        if base is None:
            return None
        try:
            base.load_certificate(self.cert_path)
        except (ValueError, OSError, paramiko.SSHException):
            return None
        return base

    def blob(self) -> bytes | None:
        if self.agent_key is not None:
            return self.agent_key.asbytes()
        found = public_key(self.path) if self.path else None
        return found[1] if found else None


def offers(
    identity_files: Sequence[str],
    certificate_files: Sequence[str],
    agent_keys: Sequence[AgentKey],
    identities_only: bool,
    accepted: Sequence[str] | None,
) -> list[Offer]:
    """Every identity to try, in OpenSSH's order, restricted to PubkeyAcceptedAlgorithms (`accepted`)."""
    files: list[Offer] = []
    for path in identity_files:
        found = public_key(path) if os.path.exists(path) else None
        files.append(Offer(path, found[0] if found else "", path=path))
        cert = certificate(path + "-cert.pub")
        if cert is not None:
            files.append(Offer(path + "-cert.pub", cert[0], path=path, cert_path=path + "-cert.pub",
                               certified=cert[2]))  # fmt: skip
    preferred: list[Offer] = []
    for path in certificate_files:
        cert = certificate(path)
        if cert is not None:
            preferred.append(Offer(path, cert[0], cert_path=path, certified=cert[2]))
    for agent_key in agent_keys:
        blob = agent_key.asbytes()
        match = next((o for o in files if o.cert_path is None and o.path and _blob_of(o.path) == blob), None)
        if match is not None:
            files.remove(match)
            preferred.append(Offer(match.label, agent_key.get_name(), path=match.path, agent_key=agent_key))
        elif not identities_only:
            preferred.append(Offer(agent_key.comment or "agent key", agent_key.get_name(), agent_key=agent_key))
    return [offer for offer in [*preferred, *files] if _accepted(offer.kind, accepted)]


def _accepted(kind: str, accepted: Sequence[str] | None) -> bool:
    """Whether PubkeyAcceptedAlgorithms lets this key type sign (an unknown type: tried, paramiko decides)."""
    if not kind or accepted is None:
        return True
    if kind == "ssh-rsa":
        return any(name in accepted for name in RSA_SIGNATURES)
    if kind == "ssh-rsa" + CERT_MARK:
        return any(name + CERT_MARK in accepted for name in RSA_SIGNATURES)
    return kind in accepted


def rejected_signatures(accepted: Sequence[str]) -> list[str]:
    """paramiko's RSA signature algorithms that PubkeyAcceptedAlgorithms leaves out (`disabled_algorithms`)."""
    return [name for name in RSA_SIGNATURES[:2] if name not in accepted and name + CERT_MARK not in accepted]


class SocketAgent(AgentSSH):
    """An agent reached at an IdentityAgent socket path (paramiko's own Agent only reads SSH_AUTH_SOCK)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        self._conn = None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        try:
            conn.connect(path)
            self._connect(conn)  # type: ignore[attr-defined]  # paramiko's AgentSSH reads the keys here
        except BaseException:
            conn.close()
            raise
        self._socket = conn

    def close(self) -> None:
        """Close the agent's socket (paramiko's AgentSSH has no public close)."""
        self._socket.close()


def agent_keys(path: str | None, timeout: float) -> tuple[list[AgentKey], SocketAgent | None]:
    """The keys of the agent at `path` (none when there is no agent or it does not answer)."""
    if path is None:
        return [], None
    try:
        agent = SocketAgent(path, timeout)
    except (OSError, paramiko.SSHException):
        return [], None
    return list(agent.get_keys()), agent


def _blob_of(path: str) -> bytes | None:
    found = public_key(path)
    return found[1] if found else None


def _public_line(path: str) -> tuple[str, bytes] | None:
    data = _read(path)
    words = data.split() if data else []
    if len(words) < 2:
        return None
    try:
        return words[0].decode("ascii"), base64.b64decode(words[1], validate=True)
    except (ValueError, UnicodeDecodeError):
        return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_KEY_FILE)
    except OSError:
        return None


def _private(path: str | None) -> paramiko.PKey | None:
    """An unencrypted private key of any type (encrypted or unreadable: None), parsed once per process for
    each version of the file (inode, size, mtime, ctime: a rewrite, a rename over it, a chmod)."""
    if path is None:
        return None
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _parsed_key(Path(path), info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@functools.lru_cache(maxsize=64)
def _parsed_key(path: Path, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> paramiko.PKey | None:
    try:
        return paramiko.PKey.from_path(path)
    # cryptography raises TypeError for an OpenSSH-format key that needs a passphrase
    except (paramiko.PasswordRequiredException, paramiko.SSHException, OSError, ValueError, TypeError):
        return None

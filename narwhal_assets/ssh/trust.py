"""The checkout-local known-hosts store (`NARWHAL_SSH_KNOWN_HOSTS`), in OpenSSH format.

Discovery enrols in accept-new mode: an unknown host's key is appended under an exclusive lock after
re-reading the file; existing lines (hashed entries, comments, other hosts) are never rewritten. Every
other command is strict. A changed key is refused in both modes, naming both SHA-256 fingerprints and the
`trust` command that replaces it once verified out of band. System known-hosts files are never read.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.local.privatefiles import FILE_MODE, ensure_private_dir, exclusive_lock, write_private


class TrustMode(StrEnum):
    ACCEPT_NEW = "accept-new"
    STRICT = "strict"


@dataclass(frozen=True)
class HostKey:
    """A public host key as OpenSSH writes it: algorithm name and base64 blob."""

    key_type: str
    blob_b64: str

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(base64.b64decode(self.blob_b64))


@dataclass(frozen=True)
class Subject:
    """Whose key is checked: an inventory host, or a ProxyJump hop (by alias) on the way to one."""

    host_id: str
    hop_of: str | None = None

    @property
    def label(self) -> str:
        return f"host {self.host_id}" if self.hop_of is None else f"ProxyJump hop {self.host_id} of host {self.hop_of}"


@dataclass(frozen=True)
class Verdict:
    """How a presented key was accepted: already `known`, or `added` by accept-new."""

    outcome: str
    fingerprint: str


class HostKeyError(NarwhalError):
    """The host could not be authenticated; never retried with weaker checking."""


class HostKeyUnknown(HostKeyError):
    pass


class HostKeyChanged(HostKeyError):
    pass


class HostKeyRevoked(HostKeyError):
    pass


def fingerprint_of(blob: bytes) -> str:
    """OpenSSH's `SHA256:<unpadded base64>` fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def format_address(host: str, port: int) -> str:
    """`host:port` for messages (IPv6 in brackets), always with the port."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_pattern(host: str, port: int) -> str:
    """The name OpenSSH looks up: `host`, or `[host]:port` when the port is not 22."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class _Line:
    text: str
    marker: str | None
    patterns: tuple[str, ...]
    key: HostKey | None

    def matches(self, name: str) -> bool:
        positive = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            if _pattern_matches(pattern[1:] if negated else pattern, name):
                if negated:
                    return False
                positive = True
        return positive

    def literal_names(self) -> tuple[str, ...] | None:
        """The names this line matches when every pattern is a plain name (the lines this tool writes),
        lowercased for lookup; None when a wildcard, negation or hashed name needs `matches`."""
        if any(p.startswith(("!", "|1|")) or "*" in p or "?" in p for p in self.patterns):
            return None
        return tuple(p.lower() for p in self.patterns)


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            salt_b64, hash_b64 = pattern[3:].split("|", 1)
            salt = base64.b64decode(salt_b64)
            expected = base64.b64decode(hash_b64)
        except ValueError:
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), expected)
    return _glob(pattern).fullmatch(name) is not None


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    """OpenSSH's host pattern: `*` and `?` are the only wildcards (`[` is literal, as in `[host]:port`),
    and host names compare without case."""
    parts = (".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _parse_line(text: str) -> _Line:
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return _Line(text, None, (), None)
    marker = fields.pop(0) if fields[0].startswith("@") else None
    if len(fields) < 3:
        return _Line(text, marker, (), None)
    return _Line(text, marker, tuple(fields[0].split(",")), HostKey(fields[1], fields[2]))


@dataclass(frozen=True)
class _Parsed:
    """One text of the store, parsed, with its plain-named key lines indexed by name: a lookup costs the
    lines that name it plus the pattern lines, not the whole file (the store grows with the fleet)."""

    lines: tuple[_Line, ...]
    named: dict[str, tuple[int, ...]]
    patterned: tuple[int, ...]

    def matching(self, name: str) -> list[_Line]:
        """The key lines that match `name`, in file order."""
        found = set(self.named.get(name.lower(), ()))
        found.update(i for i in self.patterned if self.lines[i].matches(name))
        return [self.lines[i] for i in sorted(found)]


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> _Parsed:
    lines = tuple(_parse_line(line) for line in text.splitlines(keepends=True))
    named: dict[str, list[int]] = {}
    patterned = []
    for index, line in enumerate(lines):
        if not line.key:
            continue
        names = line.literal_names()
        if names is None:
            patterned.append(index)
        for name in dict.fromkeys(names or ()):
            named.setdefault(name, []).append(index)
    return _Parsed(lines, {name: tuple(found) for name, found in named.items()}, tuple(patterned))


class KnownHostsStore:
    """One OpenSSH known-hosts file, read fresh on every check so concurrent writers are seen.

    A `staged` store keeps accept-new enrolments in memory until `commit()`, so a discovery that fails
    on any host leaves the file untouched.
    """

    def __init__(self, path: Path, *, staged: bool = False) -> None:
        self.path = path
        self.staged = staged
        self._pending: list[tuple[Subject, str, int, HostKey]] = []

    def keys_for(self, host: str, port: int) -> list[HostKey]:
        """Recorded keys for this host (plain or hashed names); `@revoked` lines are not among them."""
        return [line.key for line in self._read().matching(host_pattern(host, port)) if line.marker is None]

    def revoked(self, host: str, port: int) -> set[HostKey]:
        matching = self._read().matching(host_pattern(host, port))
        return {line.key for line in matching if line.key and line.marker == "@revoked"}

    def verify(
        self, host_id: str, host: str, port: int, presented: HostKey, mode: TrustMode, *, hop_of: str | None = None
    ) -> Verdict:
        """Accept a known key; in accept-new mode record an unknown one; refuse everything else.

        `hop_of` names the inventory host when this key belongs to one of its ProxyJump hops (`host_id` is
        then the hop's alias), so messages and the suggested `trust` command point at the right machine.
        """
        subject = Subject(host_id, hop_of)
        if presented in self.revoked(host, port):
            raise self._revoked(subject, host, port, presented)
        recorded = self.keys_for(host, port)
        if presented in recorded:
            return Verdict("known", presented.fingerprint)
        if recorded:
            raise self._changed(subject, host, port, recorded, presented)
        if mode is not TrustMode.ACCEPT_NEW:
            raise HostKeyUnknown(
                f"{subject.label} ({format_address(host, port)}): host key {presented.fingerprint} is not in "
                f"{self.path}; run `deploy-hosts discover` to enrol it (accept-new), then retry"
            )
        if self.staged:
            return self._stage(subject, host, port, presented)
        return self._enrol(subject, host, port, presented)

    def commit(self) -> list[str]:
        """Append every staged enrolment (re-checked under the lock); returns the fingerprints added."""
        added = []
        for subject, host, port, key in self._pending:
            if self._enrol(subject, host, port, key).outcome == "added":
                added.append(key.fingerprint)
        self._pending.clear()
        return added

    def _stage(self, subject: Subject, host: str, port: int, presented: HostKey) -> Verdict:
        staged = [key for _, h, p, key in self._pending if (h, p) == (host, port)]
        if staged and presented not in staged:
            raise self._changed(subject, host, port, staged, presented)
        if not staged:
            self._pending.append((subject, host, port, presented))
        return Verdict("added", presented.fingerprint)

    def _enrol(self, subject: Subject, host: str, port: int, presented: HostKey) -> Verdict:
        with self._locked():
            if presented in self.revoked(host, port):
                raise self._revoked(subject, host, port, presented)
            recorded = self.keys_for(host, port)
            if presented in recorded:
                return Verdict("known", presented.fingerprint)
            if recorded:
                raise self._changed(subject, host, port, recorded, presented)
            self._append(f"{host_pattern(host, port)} {presented.key_type} {presented.blob_b64}\n")
        return Verdict("added", presented.fingerprint)

    def replace(self, host_id: str, host: str, port: int, presented: HostKey, approved_fingerprint: str) -> None:
        """Swap this host's entries for `presented`, only when it has the operator-verified fingerprint."""
        if presented.fingerprint != approved_fingerprint:
            raise HostKeyChanged(
                f"host {host_id} ({format_address(host, port)}): presented key {presented.fingerprint} does not "
                f"match the verified fingerprint {approved_fingerprint}; nothing changed"
            )
        name = host_pattern(host, port)
        with self._locked():
            if presented in self.revoked(host, port):
                raise self._revoked(Subject(host_id), host, port, presented)
            lines = self._read().lines
            kept = [line.text for line in lines if not (line.key and line.marker is None and line.matches(name))]
            kept.append(f"{name} {presented.key_type} {presented.blob_b64}\n")
            write_private(self.path, "".join(kept))

    def fingerprints(self, host: str, port: int) -> list[str]:
        return [key.fingerprint for key in self.keys_for(host, port)]

    def _revoked(self, subject: Subject, host: str, port: int, presented: HostKey) -> HostKeyRevoked:
        """A `@revoked` line wins over any plain line for the same key, as in OpenSSH."""
        return HostKeyRevoked(
            f"{subject.label} ({format_address(host, port)}): HOST KEY REVOKED: the server presented "
            f"{presented.key_type} {presented.fingerprint}, which {self.path} marks @revoked. Refusing to connect"
        )

    def key_blobs(self) -> list[str]:
        """Every recorded key's base64 blob: what a copied host-key line would contain."""
        return [line.key.blob_b64 for line in self._read().lines if line.key]

    def _changed(
        self, subject: Subject, host: str, port: int, recorded: list[HostKey], presented: HostKey
    ) -> HostKeyChanged:
        shown = ", ".join(f"{k.key_type} {k.fingerprint}" for k in recorded)
        target = subject.host_id if subject.hop_of is None else f"<id of the inventory host at {host}>"
        return HostKeyChanged(
            f"{subject.label} ({format_address(host, port)}): HOST KEY CHANGED: {self.path} records {shown}, "
            f"the server presented {presented.key_type} {presented.fingerprint}. Refusing to connect. If the "
            f"change is expected, verify the new key through the private access source, then run "
            f"`deploy-hosts trust --host {target} --fingerprint {presented.fingerprint}`"
        )

    def _read(self) -> _Parsed:
        """The file as it is now (read each time, so other writers are seen), parsed once per text."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        return _parsed(text)

    def _append(self, line: str) -> None:
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            if os.fstat(fd).st_size and not self.path.read_bytes().endswith(b"\n"):
                line = "\n" + line
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(self.path, FILE_MODE)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(self.path.with_name(self.path.name + ".lock"))

    # Staged enrolments travel through the discovery run directory, so the trust store is published with the
    # config set (by another op, maybe another process) instead of before it.

    def staged_entries(self) -> list[StagedKey]:
        """The pending enrolments, each named by the inventory host whose connection presented the key (for a
        ProxyJump hop, the host behind it): which alias a hop has is the operator's configuration, not a name
        a run directory may keep."""
        return [StagedKey(s.hop_of or s.host_id, s.hop_of is not None, host, port, key.key_type, key.blob_b64)
                for s, host, port, key in self._pending]  # fmt: skip

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The store's writer lock, for a caller that replaces the file itself (the config-set publisher)."""
        return self._locked()

    def text_with(self, entries: list[StagedKey]) -> str:
        """The store's current text plus `entries` not yet recorded; a conflicting key is refused (call locked)."""
        text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
        if text and not text.endswith("\n"):
            text += "\n"
        for entry in entries:
            presented = HostKey(entry.key_type, entry.blob_b64)
            recorded = self.keys_for(entry.host, entry.port)
            if presented in recorded:
                continue
            if recorded or presented in self.revoked(entry.host, entry.port):
                raise self._changed(entry.subject, entry.host, entry.port, recorded, presented)
            text += f"{host_pattern(entry.host, entry.port)} {presented.key_type} {presented.blob_b64}\n"
        return text


@dataclass(frozen=True)
class StagedKey:
    """An accept-new enrolment not yet recorded: which inventory host's connection (its own key, or a ProxyJump
    hop's on the way to it) presented which key for which known-hosts name."""

    host_id: str
    hop: bool
    host: str
    port: int
    key_type: str
    blob_b64: str

    @property
    def name_sha256(self) -> str:
        """SHA-256 of the known-hosts name: what a run directory records instead of the address itself."""
        return hashlib.sha256(host_pattern(self.host, self.port).encode("utf-8")).hexdigest()

    @property
    def subject(self) -> Subject:
        """Whose key it is, for messages; a hop is shown by its address (its alias is not kept)."""
        return Subject(format_address(self.host, self.port), self.host_id) if self.hop else Subject(self.host_id)

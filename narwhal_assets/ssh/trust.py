"""The checkout-local known-hosts store (`NARWHAL_SSH_KNOWN_HOSTS`), read and written as OpenSSH 9.2 does.

The file is bytes split on `\\n` only, each line up to its first NUL; OpenSSH's rules decide everything
else (docs/known-hosts.md): markers, pattern lists with `*`, `?` and `!`, `|1|` hashed names, ASCII-only
case folding, `[host]:port` names with the plain name tried for a matching key when the bracketed one has
none, `@revoked` keys (and CAs), `@cert-authority` host certificates. A line OpenSSH would ignore is
ignored with a `KnownHostsLineIgnored` warning naming its number, never an error for any host.

Discovery enrols in accept-new mode: an unknown host's key is appended under an exclusive lock after
re-reading the file; existing lines are never rewritten. Every other command is strict. A changed or
revoked key is refused in both modes, naming the SHA-256 fingerprints and, for a changed key, the `trust`
command that replaces it once verified out of band (the only rewrite: by atomic replace, of that name's own
lines). System known-hosts files are never read.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from narwhal_assets.core.errors import HostKeyChanged, HostKeyError, HostKeyRevoked, HostKeyUnknown
from narwhal_assets.local.privatefiles import FILE_MODE, ensure_private_dir, exclusive_lock, write_private
from narwhal_assets.ssh.sshkey import KEY_NAMES, KeyProblem, PublicKey, b64_pton, read_key
from narwhal_assets.ssh.sshkey import fingerprint_of as fingerprint_of  # part of this module's API

CA_MARKER, REVOKED_MARKER = "@cert-authority", "@revoked"
MARKER_MAX = 31  # check_markers: a marker word is shorter than 32 bytes
SUBPATTERN_MAX = 1022  # match_pattern_list copies a subpattern into 1024 bytes: a longer one matches nothing
HASH_MAGIC = b"|1|"
SALT_BYTES = 20  # HMAC-SHA1
BLANKS = b" \t"
UNWRITABLE = re.compile(rb"[\s,*?\x00]|^[!|@#]")  # a name that would not read back as itself


class TrustMode(StrEnum):
    ACCEPT_NEW = "accept-new"
    STRICT = "strict"


class KnownHostsLineIgnored(UserWarning):
    """A store line OpenSSH ignores (bad key, bad marker, bad hashed name), ignored here too."""


@dataclass(frozen=True)
class HostKey:
    """A public host key (or host certificate) as OpenSSH writes it: algorithm name and base64 blob."""

    key_type: str
    blob_b64: str

    @property
    def fingerprint(self) -> str:
        """The SHA-256 fingerprint of the public key (of a certificate's key, as ssh-keygen -l shows it)."""
        try:
            return _public(self).fingerprint
        except KeyProblem:
            return "SHA256:(not a valid key)"

    @classmethod
    def of(cls, key: PublicKey) -> HostKey:
        """A parsed key in OpenSSH's own spelling (`ssh-rsa` for any RSA key name, canonical base64)."""
        name, blob = (key.name, key.blob) if key.certificate else (key.plain_name, key.plain)
        return cls(name, base64.b64encode(blob).decode())


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


def format_address(host: str, port: int) -> str:
    """`host:port` for messages (IPv6 in brackets), always with the port."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_pattern(host: str, port: int) -> str:
    """The name OpenSSH looks up and writes: the host name in ASCII lower case, as `[host]:port` when the
    port is not 22."""
    name = _ascii_lower(host)
    return name if port == 22 else f"[{name}]:{port}"


def known_hosts_name(host: str, port: int, alias: str | None = None) -> str:
    """The name a host's key is recorded under: its `HostKeyAlias` (in lower case, without any port: OpenSSH
    looks the alias up alone), else `host_pattern`."""
    return _ascii_lower(alias) if alias is not None else host_pattern(host, port)


def _ascii_lower(text: str) -> str:
    """Lower case as OpenSSH's `lowercase()`: ASCII letters only."""
    return _bytes(text).lower().decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


@functools.lru_cache(maxsize=4096)
def _public(key: HostKey) -> PublicKey:
    return read_key(_bytes(f"{key.key_type} {key.blob_b64}"))


@dataclass(frozen=True)
class _Name:
    """One lookup: the name tried first, the plain host name OpenSSH falls back to for a key the first name
    does not record (no alias, port not 22), and the name a host certificate must list."""

    host: str
    port: int
    alias: str | None

    @property
    def primary(self) -> bytes:
        return _bytes(known_hosts_name(self.host, self.port, self.alias))

    @property
    def fallback(self) -> bytes | None:
        return _bytes(_ascii_lower(self.host)) if self.alias is None and self.port != 22 else None

    @property
    def principal(self) -> bytes:
        return _bytes(_ascii_lower(self.alias if self.alias is not None else self.host))

    @property
    def written(self) -> str:
        return known_hosts_name(self.host, self.port, self.alias)


@dataclass(frozen=True, slots=True)
class _Line:
    """A line that is not a comment: its marker, host-pattern field and what follows (key, comment), or
    `problem` when OpenSSH ignores it whatever the name looked up (a bad marker or hashed name)."""

    number: int
    marker: str | None
    hosts: bytes
    rest: bytes
    problem: str | None = None
    salt: bytes = b""  # a hashed name's salt and the base64 HMAC that must follow it
    digest: bytes = b""

    def matches(self, name: bytes) -> bool:
        if self.salt:
            return base64.b64encode(hmac.digest(self.salt, name, "sha1")) == self.digest
        return _hostname_matches(name.lower(), self.hosts)


def _names(line: _Line) -> set[bytes]:
    """The names of a plain (unhashed) line's pattern list, in lower case."""
    return {pattern.lower() for pattern in line.hosts.split(b",")}


def _hostname_matches(name: bytes, patterns: bytes) -> bool:
    """OpenSSH's match_hostname: a comma list of `*`/`?` globs compared in ASCII lower case, where a
    matching `!pattern` excludes the name whatever else matches."""
    positive = False
    for pattern in patterns.split(b","):
        negated = pattern.startswith(b"!")
        if _glob(pattern[1:] if negated else pattern).fullmatch(name):
            if negated:
                return False
            positive = True
    return positive


@functools.lru_cache(maxsize=4096)
def _glob(pattern: bytes) -> re.Pattern[bytes]:
    """`*` is any run of bytes, `?` one byte; nothing else is special (`[` is literal, as in `[host]:port`)."""
    parts = (b".*" if c == 42 else b"." if c == 63 else re.escape(bytes([c])) for c in pattern.lower())
    return re.compile(b"".join(parts), re.DOTALL)


def _parse_line(number: int, line: bytes) -> _Line | None:
    """One line as hostkeys_foreach reads it; None for a blank line or comment."""
    text = line.split(b"\0", 1)[0].lstrip(BLANKS)
    if not text or text.startswith(b"#"):
        return None
    marker = None
    while text.startswith(b"@"):
        end = text.find(b" ") if b" " in text else text.find(b"\t")
        word = text[:end] if end > 1 else b""
        if marker is not None or not 1 < end <= MARKER_MAX or word not in (b"@cert-authority", b"@revoked"):
            return _Line(number, None, b"", b"", problem="not a valid @ marker")
        marker, text = word.decode(), text[end:].lstrip(BLANKS)
    end = min((i for i in (text.find(b" "), text.find(b"\t")) if i >= 0), default=len(text))
    hosts, rest = text[:end], text[end + 1 :]
    if not hosts.startswith(b"|"):
        return _Line(number, marker, hosts, rest)
    salt, digest = _hashed_name(hosts)
    if salt is None:
        return _Line(number, marker, hosts, rest, problem="not a valid hashed host name")
    return _Line(number, marker, hosts, rest, salt=salt, digest=digest)


def _hashed_name(hosts: bytes) -> tuple[bytes | None, bytes]:
    """The salt of a `|1|salt|hmac` field and the base64 HMAC it must end with (OpenSSH compares the field
    with its own encoding, so a field spelled otherwise never matches); salt None when OpenSSH rejects it."""
    end = hosts.find(b"|", len(HASH_MAGIC))
    if not hosts.startswith(HASH_MAGIC) or not 0 < end - len(HASH_MAGIC) <= 1024:
        return None, b""
    try:
        salt = b64_pton(hosts[len(HASH_MAGIC) : end])
    except KeyProblem:
        return None, b""
    if len(salt) != SALT_BYTES:
        return None, b""
    prefix = HASH_MAGIC + base64.b64encode(salt) + b"|"
    return salt, hosts[len(prefix) :] if hosts.startswith(prefix) else b"\0"  # "\0": no HMAC encodes to it


@dataclass(frozen=True)
class _Entry:
    """A valid line matching a looked-up name."""

    number: int
    marker: str | None
    key: PublicKey
    line: _Line


class _Parsed:
    """One text of the store, parsed once; its key lines with plain names are indexed by name, so a lookup
    costs the lines naming it plus the pattern and hashed lines, not the whole file (the store grows with
    the fleet). Keys are parsed, and each name's matches found, only when a lookup needs them, once."""

    def __init__(self, data: bytes):
        self.raws = data.split(b"\n")
        if self.raws[-1] == b"":
            self.raws.pop()
        self.lines = [line for n, raw in enumerate(self.raws, 1) if (line := _parse_line(n, raw)) is not None]
        self.broken = [line for line in self.lines if line.problem]
        self.named: dict[bytes, list[int]] = {}
        self.scanned: list[int] = []
        for index, line in enumerate(self.lines):
            if line.problem:
                continue
            patterns = [] if line.salt else line.hosts.split(b",")
            if any(len(p) - p.startswith(b"!") > SUBPATTERN_MAX for p in patterns):
                continue  # OpenSSH stops at an over-long pattern: the line matches no name
            if line.salt or any(p.startswith(b"!") or b"*" in p or b"?" in p for p in patterns):
                self.scanned.append(index)
                continue
            for name in dict.fromkeys(p.lower() for p in patterns if p):
                self.named.setdefault(name, []).append(index)
        self._matches: dict[bytes, tuple[list[_Entry], list[tuple[int, str]]]] = {}
        self._keys: dict[int, PublicKey | KeyProblem] = {}

    def lookup(self, name: bytes) -> tuple[list[_Entry], list[tuple[int, str]]]:
        """The valid lines matching `name`, in file order, and (number, reason) of those OpenSSH ignores."""
        found = self._matches.get(name)
        if found is None:
            indices = {*self.named.get(name.lower(), ()), *(i for i in self.scanned if self.lines[i].matches(name))}
            entries, ignored = [], []
            for index in sorted(indices):
                key = self._key(index)
                if isinstance(key, KeyProblem):
                    ignored.append((self.lines[index].number, str(key)))
                else:
                    line = self.lines[index]
                    entries.append(_Entry(line.number, line.marker, key, line))
            found = self._matches[name] = (entries, ignored)
        return found

    def _key(self, index: int) -> PublicKey | KeyProblem:
        key = self._keys.get(index)
        if key is None:
            rest = self.lines[index].rest.lstrip(BLANKS)
            try:
                if not rest or rest.startswith(b"#"):
                    raise KeyProblem("no key after the host names")
                key = read_key(rest)
            except KeyProblem as problem:
                key = problem
            self._keys[index] = key
        return key

    def all_keys(self) -> list[PublicKey]:
        """Every valid key in the file, whatever its marker or names."""
        return [key for i in range(len(self.lines)) if isinstance(key := self._key(i), PublicKey)]


@functools.lru_cache(maxsize=4)
def _parsed(data: bytes) -> _Parsed:
    return _Parsed(data)


@dataclass
class _Judgement:
    """OpenSSH's check_host_key for one presented key: `accepted`, or why not (`status` of the name looked
    up first: new, changed, revoked), plus what the messages name."""

    accepted: bool = False
    status: str = "new"
    revoked: bool = False  # a @revoked line matched on some step (OpenSSH warns even where it goes on)
    certificate_problem: str | None = None
    recorded: list[PublicKey] = field(default_factory=list)
    authorities: list[int] = field(default_factory=list)

    @property
    def refusal(self) -> str:
        return "revoked" if self.revoked else self.status


class KnownHostsStore:
    """One OpenSSH known-hosts file, read fresh on every check so concurrent writers are seen.

    A `staged` store keeps accept-new enrolments in memory until `commit()`, so a discovery that fails
    on any host leaves the file untouched. Every lookup takes the host's `alias` (HostKeyAlias) when it
    has one: the key is then recorded and looked up under that name alone, as OpenSSH does.
    """

    def __init__(self, path: Path, *, staged: bool = False) -> None:
        self.path = path
        self.staged = staged
        self._pending: list[tuple[Subject, _Name, HostKey]] = []
        self._staged_by_name: dict[bytes, PublicKey] = {}  # the one pending key per name: one lookup per host
        self._staging = threading.Lock()  # hosts are verified in parallel; each check-and-stage is one step

    def keys_for(self, host: str, port: int, *, alias: str | None = None) -> list[HostKey]:
        """The keys that can be accepted for this host (plain or hashed names, patterns), in file order:
        those recorded under its name, or, when there are none, under the plain host name OpenSSH falls
        back to; `@revoked` and `@cert-authority` lines are not among them."""
        parsed, name = self._read(), _Name(host, port, alias)
        keys = self._plain(parsed, name.primary)
        if not keys and name.fallback is not None:
            keys = self._plain(parsed, name.fallback)
        return [HostKey.of(key) for key in keys]

    def revoked(self, host: str, port: int, *, alias: str | None = None) -> set[HostKey]:
        entries = self._lookup(self._read(), _Name(host, port, alias).primary)
        return {HostKey.of(e.key) for e in entries if e.marker == REVOKED_MARKER}

    def fingerprints(self, host: str, port: int, *, alias: str | None = None) -> list[str]:
        return [key.fingerprint for key in self.keys_for(host, port, alias=alias)]

    def host_key_algorithms(self, host: str, port: int, offered: list[str], *, alias: str | None = None) -> list[str]:
        """`offered` host-key algorithms (in preference order, certificates first as in OpenSSH's default)
        ordered as OpenSSH orders them for this host (order_hostkeyalgs): unchanged when a key of the first
        one's type is recorded; else first every certificate algorithm when an @cert-authority line matches
        and the algorithms of recorded key types, then the others. So a host with a certificate presents it,
        and an @revoked CA is seen."""
        entries = self._lookup(self._read(), _Name(host, port, alias).primary)
        recorded = {(KEY_NAMES[e.key.name].kind, KEY_NAMES[e.key.name].curve) for e in entries
                    if e.marker is None and e.key.certificate is None}  # fmt: skip
        authority = any(e.marker == CA_MARKER for e in entries)

        def preferred(algorithm: str) -> bool:
            kind = KEY_NAMES.get(algorithm)
            return kind is not None and ((kind.cert and authority) or (kind.kind, kind.curve) in recorded)

        best = KEY_NAMES.get(offered[0]) if offered else None
        if best is not None and (best.kind, best.curve) in recorded:
            return list(offered)
        return [a for a in offered if preferred(a)] + [a for a in offered if not preferred(a)]

    def key_blobs(self) -> list[str]:
        """Every valid key's base64 blob, whatever its marker: what a copied host-key line would contain."""
        return [base64.b64encode(key.blob).decode() for key in self._read().all_keys()]

    def verify(
        self,
        host_id: str,
        host: str,
        port: int,
        presented: HostKey,
        mode: TrustMode,
        *,
        hop_of: str | None = None,
        alias: str | None = None,
    ) -> Verdict:
        """Accept a known key (or a host certificate signed by a trusted CA); in accept-new mode record an
        unknown one; refuse everything else.

        `hop_of` names the inventory host when this key belongs to one of its ProxyJump hops (`host_id` is
        then the hop's alias), so messages and the suggested `trust` command point at the right machine.
        """
        subject, name = Subject(host_id, hop_of), _Name(host, port, alias)
        key = self._presented(subject, name, presented)
        judgement = self._judge(self._read(), name, key)
        if judgement.accepted:
            return Verdict("known", key.fingerprint)
        if mode is not TrustMode.ACCEPT_NEW or judgement.refusal != "new" or judgement.authorities:
            raise self._refusal(subject, name, key, judgement)
        if self.staged:
            return self._stage(subject, name, key)
        return self._enrol(subject, name, key)

    def commit(self) -> list[str]:
        """Append every staged enrolment, all or none, each re-checked under the lock; returns the
        fingerprints added."""
        with self._locked():
            lines = self._new_lines(self._read_bytes(), [(s, n, _public(k)) for s, n, k in self._pending])
            self._append(lines)
        self._pending.clear()
        self._staged_by_name.clear()
        return [_public(key).fingerprint for _, key in lines]

    def replace(
        self,
        host_id: str,
        host: str,
        port: int,
        presented: HostKey,
        approved_fingerprint: str,
        *,
        alias: str | None = None,
    ) -> None:
        """Swap this host's key for `presented`, only when it has the operator-verified fingerprint.

        The lines that pin this name alone are dropped and the new key appended, the file replaced
        atomically; every other line is kept byte for byte. A line that pins this name together with others
        (a list or pattern) and another key is not split: the operator edits it.
        """
        subject, name = Subject(host_id), _Name(host, port, alias)
        key = _plain_key(self._presented(subject, name, presented))
        if key.fingerprint != approved_fingerprint:
            raise HostKeyChanged(
                f"{self._where(subject, name)}: presented key {key.fingerprint} does not match the verified "
                f"fingerprint {approved_fingerprint}; nothing changed"
            )
        with self._locked():
            parsed = self._read()
            judgement = self._judge(parsed, name, key)
            if judgement.revoked:
                raise self._refusal(subject, name, key, judgement)
            plain = [e for e in self._lookup(parsed, name.primary) if e.marker is None]
            own = {e.number for e in plain if e.line.salt or _names(e.line) == {name.primary.lower()}}
            shared = [e.number for e in plain if e.number not in own and not e.key.equals(key)]
            if shared:
                raise HostKeyChanged(
                    f"{self._where(subject, name)}: {self.path} line {shared[0]} pins this name together with "
                    "other names or patterns and another key; edit that line, then run `deploy-hosts trust` "
                    "again; nothing changed"
                )
            kept = b"".join(raw + b"\n" for number, raw in enumerate(parsed.raws, 1) if number not in own)
            pinned = any(e.number not in own for e in plain)  # a shared line with this very key stays
            write_private(self.path, kept if pinned else kept + self._line(name, key))

    def staged_entries(self) -> list[StagedKey]:
        """The pending enrolments, each named by the inventory host whose connection presented the key (for a
        ProxyJump hop, the host behind it): which alias a hop has is the operator's configuration, not a name
        a run directory may keep."""
        return [StagedKey(s.hop_of or s.host_id, s.hop_of is not None, n.host, n.port, key.key_type, key.blob_b64,
                          n.alias) for s, n, key in self._pending]  # fmt: skip

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The store's writer lock, for a caller that replaces the file itself (the config-set publisher)."""
        return self._locked()

    def content_with(self, entries: list[StagedKey]) -> bytes:
        """The store's bytes now plus `entries` not yet recorded, after a final newline; a changed, revoked or
        CA-covered key is refused (call under `locked`)."""
        data = self._read_bytes()
        staged = [(entry.subject, _Name(entry.host, entry.port, entry.alias),
                   self._presented(entry.subject, _Name(entry.host, entry.port, entry.alias), entry.key))
                  for entry in entries]  # fmt: skip
        added = b"".join(line for line, _ in self._new_lines(data, staged))
        if data and not data.endswith(b"\n") and added:
            data += b"\n"
        return data + added

    # -- checking --------------------------------------------------------------------------------------

    def _judge(self, parsed: _Parsed, name: _Name, key: PublicKey) -> _Judgement:
        judgement = _Judgement()
        judgement.accepted = self._check(parsed, name, key, judgement, fallback=False)
        judgement.recorded = self._plain(parsed, name.primary)
        names = [name.primary] if name.fallback is None else [name.primary, name.fallback]
        judgement.authorities = sorted({e.number for n in names for e in self._lookup(parsed, n)
                                        if e.marker == CA_MARKER})  # fmt: skip
        return judgement

    def _check(self, parsed: _Parsed, name: _Name, key: PublicKey, judgement: _Judgement, *, fallback: bool) -> bool:
        """OpenSSH's check_host_key: a certificate is checked against the CAs, and when that fails, its plain
        key against the keys; a name with no key for it tries the plain host name (quietly: only a matching
        key counts there)."""
        lookup = name.fallback if fallback else name.primary
        assert lookup is not None
        while True:
            status = self._status(parsed, lookup, key)
            if status == "ok":
                problem = key.certificate.host_problem(name.principal) if key.certificate is not None else None
                if problem is None:
                    return True
                judgement.certificate_problem = problem
            retry_plain_name = status == "new" and not fallback and name.fallback is not None
            if retry_plain_name and self._check(parsed, name, key, judgement, fallback=True):
                return True
            judgement.revoked |= status == "revoked"
            if key.certificate is not None and status != "revoked":
                key = _plain_key(key)
                continue
            if not fallback:
                judgement.status = status
            return False

    def _status(self, parsed: _Parsed, name: bytes, key: PublicKey) -> str:
        """check_hostkeys_by_key_or_type for one name: ok, changed (another key recorded), new or revoked."""
        entries = self._lookup(parsed, name)
        if key.certificate is not None:
            signer = key.certificate.signature_key
            status = "ok" if any(e.marker == CA_MARKER and e.key.same_public(signer) for e in entries) else "new"
        else:
            plain = [e.key for e in entries if e.marker is None]
            status = "ok" if any(key.equals(k) for k in plain) else "changed" if plain else "new"
        signers = [key] if key.certificate is None else [key, key.certificate.signature_key]
        if any(e.marker == REVOKED_MARKER and any(e.key.same_public(s) for s in signers) for e in entries):
            return "revoked"
        return status

    def _lookup(self, parsed: _Parsed, name: bytes) -> list[_Entry]:
        entries, ignored = parsed.lookup(name)
        for number, reason in [*((line.number, line.problem) for line in parsed.broken), *ignored]:
            # one call site, so Python shows each line's warning once per process
            warnings.warn(f"{self.path} line {number}: ignored, as OpenSSH ignores it: {reason}",
                          KnownHostsLineIgnored, stacklevel=1)  # fmt: skip
        return entries

    def _plain(self, parsed: _Parsed, name: bytes) -> list[PublicKey]:
        return [e.key for e in self._lookup(parsed, name) if e.marker is None]

    # -- enrolment --------------------------------------------------------------------------------------

    def _stage(self, subject: Subject, name: _Name, key: PublicKey) -> Verdict:
        with self._staging:
            staged = self._staged_by_name.get(name.primary.lower())
            if staged is not None and not key.equals(staged):
                raise self._refusal(subject, name, key, _Judgement(status="changed", recorded=[staged]))
            if staged is None:
                plain = HostKey.of(_plain_key(key))
                self._pending.append((subject, name, plain))
                self._staged_by_name[name.primary.lower()] = _public(plain)
        return Verdict("added", key.fingerprint)

    def _enrol(self, subject: Subject, name: _Name, key: PublicKey) -> Verdict:
        with self._locked():
            lines = self._new_lines(self._read_bytes(), [(subject, name, key)])
            self._append(lines)
        return Verdict("added" if lines else "known", key.fingerprint)

    def _new_lines(self, data: bytes, staged: list[tuple[Subject, _Name, PublicKey]]) -> list[tuple[bytes, HostKey]]:
        """The lines that record `staged` keys not yet accepted by the store's `data` (each judged against
        it as accept-new would); raises for any one that is changed, revoked or left to a CA."""
        parsed, lines, batch = _parsed(data), [], dict[str, PublicKey]()
        for subject, name, key in staged:
            earlier = batch.get(name.written)
            if earlier is not None:  # the same name twice in one batch: one key, or a conflict
                if earlier.same_public(key):
                    continue
                raise self._refusal(subject, name, key, _Judgement(status="changed", recorded=[earlier]))
            batch[name.written] = key
            judgement = self._judge(parsed, name, key)
            if judgement.accepted:
                continue
            if judgement.refusal != "new" or judgement.authorities:
                raise self._refusal(subject, name, key, judgement)
            if UNWRITABLE.search(_bytes(name.written)):
                raise HostKeyUnknown(
                    f"{self._where(subject, name)}: its known-hosts name cannot be recorded in {self.path} (it "
                    "holds spaces, commas, wildcards or a leading marker character); nothing recorded"
                )
            lines.append((self._line(name, key), HostKey.of(_plain_key(key))))
        return lines

    @staticmethod
    def _line(name: _Name, key: PublicKey) -> bytes:
        plain = _plain_key(key)
        return _bytes(f"{name.written} {plain.plain_name} {base64.b64encode(plain.plain).decode()}\n")

    # -- messages ---------------------------------------------------------------------------------------

    def _presented(self, subject: Subject, name: _Name, presented: HostKey) -> PublicKey:
        try:
            return _public(presented)
        except KeyProblem as problem:
            raise HostKeyError(
                f"{self._where(subject, name)}: the host presented a key that does not parse ({problem})"
            ) from None

    @staticmethod
    def _where(subject: Subject, name: _Name) -> str:
        alias = f", HostKeyAlias {name.alias}" if name.alias is not None else ""
        return f"{subject.label} ({format_address(name.host, name.port)}{alias})"

    def _refusal(self, subject: Subject, name: _Name, key: PublicKey, judgement: _Judgement) -> HostKeyError:
        where, shown = self._where(subject, name), f"{key.plain_name} {key.fingerprint}"
        if judgement.refusal == "revoked":
            return HostKeyRevoked(  # a @revoked line wins over any plain line for the same key, as in OpenSSH
                f"{where}: HOST KEY REVOKED: the server presented {shown}, which {self.path} marks @revoked "
                "(the key or the CA that signed its certificate). Refusing to connect"
            )
        note = self._authority_note(key, judgement)
        if judgement.refusal == "changed":
            recorded = ", ".join(f"{k.plain_name} {k.fingerprint}" for k in judgement.recorded)
            target = subject.host_id if subject.hop_of is None else f"<id of the inventory host at {name.host}>"
            return HostKeyChanged(
                f"{where}: HOST KEY CHANGED: {self.path} records {recorded}, the server presented {shown}{note}. "
                "Refusing to connect. If the change is expected, verify the new key through the private access "
                f"source, then run `deploy-hosts trust --host {target} --fingerprint {key.fingerprint}`"
            )
        advice = (": record the host's own key, verified out of band, with `deploy-hosts trust`" if note else
                  "; run `deploy-hosts discover` to enrol it (accept-new), then retry")  # fmt: skip
        return HostKeyUnknown(f"{where}: host key {key.fingerprint} is not in {self.path}{note}{advice}")

    def _authority_note(self, key: PublicKey, judgement: _Judgement) -> str:
        """Why @cert-authority lines for this name did not vouch for the host (empty when there are none)."""
        if not judgement.authorities:
            return ""
        lines = ", ".join(map(str, judgement.authorities))
        why = (f"its host certificate is not valid for this name ({judgement.certificate_problem})"
               if key.certificate is not None and judgement.certificate_problem else
               "no certificate signed by it was presented (this tool checks host certificates only when the "
               "connection negotiates one; it does not enrol a CA-trusted host's plain key)")  # fmt: skip
        return f"; line {lines} trusts a certificate authority (@cert-authority) for this name, but {why}"

    # -- the file ---------------------------------------------------------------------------------------

    def _read_bytes(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise HostKeyError(f"{self.path}: cannot read the trust store ({exc.strerror or exc})") from None

    def _read(self) -> _Parsed:
        """The file as it is now (read each time, so other writers are seen), parsed once per content."""
        return _parsed(self._read_bytes())

    def _append(self, lines: list[tuple[bytes, HostKey]]) -> None:
        """Append `lines` in one write, after a newline if the file does not end with one (call locked)."""
        if not lines:
            return
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            size = os.fstat(fd).st_size
            data = b"".join(line for line, _ in lines)
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(self.path, FILE_MODE)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(self.path.with_name(self.path.name + ".lock"))


def _plain_key(key: PublicKey) -> PublicKey:
    """A certificate's plain key (OpenSSH's retry "with plain key"); a plain key itself."""
    return key if key.certificate is None else PublicKey(key.plain_name, key.plain, key.plain)


@dataclass(frozen=True)
class StagedKey:
    """An accept-new enrolment not yet recorded: which inventory host's connection (its own key, or a ProxyJump
    hop's on the way to it) presented which key for which known-hosts name (`alias`: its HostKeyAlias)."""

    host_id: str
    hop: bool
    host: str
    port: int
    key_type: str
    blob_b64: str
    alias: str | None = None

    @property
    def key(self) -> HostKey:
        return HostKey(self.key_type, self.blob_b64)

    @property
    def name_sha256(self) -> str:
        """SHA-256 of the known-hosts name: what a run directory records instead of the address itself."""
        return hashlib.sha256(_bytes(known_hosts_name(self.host, self.port, self.alias))).hexdigest()

    @property
    def subject(self) -> Subject:
        """Whose key it is, for messages; a hop is shown by its address (its alias is not kept)."""
        return Subject(format_address(self.host, self.port), self.host_id) if self.hop else Subject(self.host_id)

"""Resolve a destination value (`alias`, `host`, `user@host`) through the operator's OpenSSH config.

Only the options that decide where and as whom we connect are honoured: HostName, User, Port,
IdentityFile, IdentitiesOnly and ProxyJump (chained). Host-key options in the config are deliberately
ignored: trust always comes from the checkout-local store.
"""

from __future__ import annotations

import functools
import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.trust import format_address

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
MAX_JUMPS = 8
MAX_INCLUDE_DEPTH = 16
INCLUDE_RE = re.compile(r"^[ \t]*Include[ \t]+(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Endpoint:
    """Where one SSH hop goes; `jumps` are the ProxyJump hops to cross first, outermost first."""

    alias: str
    host: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    jumps: tuple[Endpoint, ...] = ()

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    def hops(self) -> list[Endpoint]:
        """The ProxyJump hops in connection order, each hop's own jumps first (as OpenSSH chains them)."""
        order: list[Endpoint] = []
        for jump in self.jumps:
            order += [*jump.hops(), jump]
        return order


def resolve_endpoint(destination: str, ssh_config: Path | None, *, depth: int = 0) -> Endpoint:
    """Turn a destination into an Endpoint, following ProxyJump in the config."""
    if depth > MAX_JUMPS:
        raise InputError([f"ssh config {ssh_config}: ProxyJump chain longer than {MAX_JUMPS} hops"])
    user, _, alias = destination.rpartition("@")
    port_override: int | None = None
    if alias.startswith("[") and "]:" in alias:
        alias, port_text = alias[1:].split("]:", 1)
        port_override = _port(port_text)
    if not alias or any(ch.isspace() for ch in destination) or alias.startswith("-"):
        raise InputError(["destination: not an SSH destination ([user@]host or alias)"])
    options = _config(ssh_config).lookup(alias)
    port = port_override or _port(str(options.get("port", "22")))
    jumps: tuple[Endpoint, ...] = ()
    proxy = options.get("proxyjump")
    if proxy and proxy.lower() != "none":
        jumps = tuple(resolve_endpoint(hop, ssh_config, depth=depth + 1) for hop in proxy.split(","))
    return Endpoint(
        alias=alias,
        host=options.get("hostname", alias),
        port=port,
        user=user or options.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in options.get("identityfile", [])),
        identities_only=str(options.get("identitiesonly", "no")).lower() == "yes",
        jumps=jumps,
    )


def identity_candidates(endpoint: Endpoint) -> list[Path]:
    """Key files to try, as OpenSSH would: configured ones, then the defaults unless IdentitiesOnly."""
    files = list(endpoint.identity_files)
    if not endpoint.identities_only:
        files += [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
    seen: list[Path] = []
    for name in files:
        path = Path(name)
        if path.is_file() and path not in seen:
            seen.append(path)
    return seen


class _ParsedConfig:
    """One config text, parsed once, with the options found for each alias kept.

    A fleet command resolves every host's destination several times (access, connect, the install's
    destination check), and the config lists the whole fleet: parsing it for every resolve cost 3.4 ms per
    resolve at 32 hosts (`benchmarks/bench_ssh_config.py`). A lookup scanning every block made the first
    resolve of each alias linear in the fleet too (57 ms at 1,024 hosts), so the `Host` blocks whose
    patterns are all plain names are indexed by name: an alias is looked up, by paramiko and with its rules,
    over the blocks naming it plus every block with a wildcard, a negation, a `[` or a `Match`, in file
    order. Those are the only blocks that can apply, so the options are the same (a config with
    `CanonicalizeHostname`, whose second pass looks up another name, is always looked up whole). The file is
    still read on every resolve, so an edited config takes effect at once (a `Match exec` in it runs once
    per alias and text in a process).
    """

    def __init__(self, text: str):
        self._config = paramiko.SSHConfig.from_text(text)
        self._found: dict[str, paramiko.SSHConfigDict] = {}
        # paramiko keeps the blocks, in file order, as {"host": [patterns] | "matches": [...], "config": {}}.
        self._blocks: list[dict[str, Any]] = self._config._config
        self._whole = any("canonicalizehostname" in block["config"] for block in self._blocks)
        self._named: dict[str, list[int]] = {}
        self._always: list[int] = []
        for index, block in enumerate(self._blocks):
            names = _plain_names(block)
            if names is None:
                self._always.append(index)
            for name in names or ():
                self._named.setdefault(name, []).append(index)

    def lookup(self, alias: str) -> paramiko.SSHConfigDict:
        found = self._found.get(alias)
        if found is None:
            found = self._found[alias] = self._candidates(alias).lookup(alias)
        return found

    def _candidates(self, alias: str) -> paramiko.SSHConfig:
        """The blocks that can apply to `alias`, in file order, as a config of their own (or the whole one)."""
        if self._whole:
            return self._config
        candidates = paramiko.SSHConfig()
        candidates._config = [self._blocks[i] for i in sorted([*self._named.get(alias, ()), *self._always])]
        return candidates


def _plain_names(block: dict[str, Any]) -> list[str] | None:
    """A `Host` block's patterns when paramiko can match each only by equality (fnmatch: no `*?[`), else None."""
    patterns = block.get("host")
    if "matches" in block or not patterns or any(set(p) & set("*?[!") for p in patterns):
        return None
    return list(dict.fromkeys(patterns))


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> _ParsedConfig:
    return _ParsedConfig(text)


def _config(path: Path | None) -> _ParsedConfig:
    if path is None:
        return _parsed("")
    try:
        return _parsed(_expand_includes(path, depth=0))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise InputError([f"ssh config {path}: cannot parse ({type(exc).__name__})"]) from None


def _expand_includes(path: Path, depth: int) -> str:
    """The config text with `Include` directives inlined (paramiko ignores them; OpenSSH follows them).

    Relative patterns resolve against ~/.ssh as OpenSSH does for user configs; globs expand sorted.
    """
    if depth > MAX_INCLUDE_DEPTH:
        raise InputError([f"ssh config {path}: Include nested deeper than {MAX_INCLUDE_DEPTH}"])
    text = path.read_text(encoding="utf-8")
    if "include" not in text.lower():  # a scan at C speed; the regex below tries every position
        return text + "\n"
    pieces, done = [], 0
    for match in INCLUDE_RE.finditer(text):
        pieces.append(text[done : match.start()])
        done = match.end()
        for pattern in shlex.split(match.group(1)):
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
            for included in sorted(glob.glob(pattern)):
                pieces.append(_expand_includes(Path(included), depth + 1))
    pieces.append(text[done:])
    return "".join(pieces) + "\n"


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InputError(["destination: port must be 1..65535"])
    return int(text)

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

import paramiko

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.trust import format_address

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
MAX_JUMPS = 8
MAX_INCLUDE_DEPTH = 16
INCLUDE_RE = re.compile(r"^\s*Include\s+(.+?)\s*$", re.IGNORECASE)


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
    resolve at 32 hosts, 0.16 ms a repeated one now (`benchmarks/bench_ssh_config.py`). A first lookup scans
    every block, as OpenSSH does. The file is still read on every resolve, so an edited config takes effect at
    once (a `Match exec` in it runs once per alias and text in a process).
    """

    def __init__(self, text: str):
        self._config = paramiko.SSHConfig.from_text(text)
        self._found: dict[str, paramiko.SSHConfigDict] = {}

    def lookup(self, alias: str) -> paramiko.SSHConfigDict:
        found = self._found.get(alias)
        if found is None:
            found = self._found[alias] = self._config.lookup(alias)
        return found


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
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = INCLUDE_RE.match(line)
        if not match:
            lines.append(line)
            continue
        for pattern in shlex.split(match.group(1)):
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
            for included in sorted(glob.glob(pattern)):
                lines.append(_expand_includes(Path(included), depth + 1))
    return "\n".join(lines) + "\n"


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InputError(["destination: port must be 1..65535"])
    return int(text)

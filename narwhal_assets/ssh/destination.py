"""Resolve a destination value (`alias`, `host`, `user@host`, `user@[host]:port`, `ssh://user@host:port`)
through the operator's OpenSSH config: the answer is OpenSSH's own.

`ssh -G` (resolver.py) evaluates the config; this module turns its answer into an `Endpoint`: it expands what
OpenSSH expands only when connecting (IdentityFile, CertificateFile, ProxyCommand, a ProxyJump's parts:
tokens.py), resolves each ProxyJump hop the way ssh launches the hop (`ssh [-l user] [-p port] [-J the hops
before it] hop`, so the hop's own config applies, ProxyCommand included), and records what the paramiko
transport does with every other option (policy.py): host-key options are overridden by the checkout store,
options not used are listed, options it cannot reproduce refuse the host.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh import identities, policy, resolver
from narwhal_assets.ssh.policy import Algorithms, NotApplied, Refusal
from narwhal_assets.ssh.resolver import Answer, Query, config_label
from narwhal_assets.ssh.tokens import Connection, ExpansionError, LocalAccount, expand_file, expand_proxy
from narwhal_assets.ssh.trust import format_address, host_pattern

MAX_JUMPS = 8
NOT_A_DESTINATION = "destination: not an SSH destination ([user@]host, alias, user@[host]:port or ssh://...)"


@dataclass(frozen=True)
class Endpoint:
    """Where one SSH hop goes and how: OpenSSH's answer for it, expanded. `via` is the ProxyJump hop the
    connection goes through (itself resolved with the hops before it), or None."""

    destination: str  # as given (a hop: as the ProxyJump names it)
    alias: str  # the host OpenSSH is given (`%n`)
    host: str  # HostName, as OpenSSH resolved it
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    certificate_files: tuple[str, ...] = ()
    identities_only: bool = False
    identity_agent: str | None = None  # the agent's socket, None for no agent
    host_key_alias: str | None = None
    proxy_command: str | None = None
    via: Endpoint | None = None
    connect_timeout: int | None = None
    address_family: str = "any"
    bind_address: str | None = None
    algorithms: Algorithms = field(default_factory=Algorithms)
    auth_methods: tuple[str, ...] = ("publickey", "password")
    auth_off: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False)  # method -> (option, value)
    compression: bool = False
    tcp_keepalive: bool = True
    not_applied: tuple[NotApplied, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    config: Path | None = field(default=None, compare=False)
    query: Query | None = field(default=None, compare=False)  # the arguments OpenSSH was given for it

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def known_host(self) -> tuple[str, int]:
        """The (name, port) OpenSSH looks the host key up and records it under: the HostKeyAlias alone
        (whatever the port, as OpenSSH does), else the host name and port."""
        return (self.host_key_alias, 22) if self.host_key_alias else (self.host, self.port)

    @property
    def known_hosts_names(self) -> tuple[str, ...]:
        return (host_pattern(*self.known_host),)

    def hops(self) -> list[Endpoint]:
        """The ProxyJump hops in connection order (outermost first), each hop's own hops before it."""
        return [*self.via.hops(), self.via] if self.via is not None else []

    def refusal(self) -> str | None:
        """Why the paramiko transport cannot connect to this endpoint or a hop of it (the first reason)."""
        for endpoint in [*self.hops(), self]:
            if endpoint.refusals:
                refusal = endpoint.refusals[0]
                hop = f"ProxyJump hop {endpoint.destination}: " if endpoint is not self else ""
                return (f"{hop}{refusal.option} {printable(refusal.value, 120)} ({config_label(endpoint.config)}): "
                        f"{refusal.reason}")  # fmt: skip
        return None

    def refuse(self, who: str) -> None:
        """Raise the refusal, if any, for `who` (the host id and its variable)."""
        refusal = self.refusal()
        if refusal is not None:
            raise InputError([f"{who}: {refusal}"])


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """(user, host, port) of a destination; nothing about its value reaches the message."""
    if not text or any(ch.isspace() or not ch.isprintable() for ch in text):
        raise InputError([NOT_A_DESTINATION])
    uri = text.startswith("ssh://")
    rest = text[len("ssh://") :].removesuffix("/") if uri else text
    user, at, hostport = rest.rpartition("@")
    host, port = _host_port(hostport, allow_plain_port=uri)
    if (at and not user) or not host or host.startswith("-") or "/" in host:
        raise InputError([NOT_A_DESTINATION])
    return (user or None), host, port


def resolve_endpoint(destination: str, ssh_config: Path | None) -> Endpoint:
    """What OpenSSH connects to for `destination`, with the `user@` and port given passed as `-l` and `-p`."""
    user, host, port = parse_destination(destination)
    return _resolve(Query(host, user, port, None, ssh_config), destination, LocalAccount.current(), os.environ, 0)


def _resolve(query: Query, shown: str, local: LocalAccount, environ: Mapping[str, str], depth: int) -> Endpoint:
    where = config_label(query.config)
    answer = resolver.ask(query)
    hostname, user = answer.one("hostname") or query.host, answer.one("user") or local.user
    port = _port_of(answer, where)
    key_alias = answer.one("hostkeyalias")
    connection = Connection(hostname, port, user, query.host, key_alias if key_alias != "none" else None)

    def expanded(option: str, value: str, *, proxy: bool = False) -> str:
        try:
            return expand_proxy(value, connection, local) if proxy else expand_file(value, connection, local, environ)
        except ExpansionError as exc:
            raise InputError([f"{where}: {option} {printable(value, 120)}: OpenSSH refuses it: {exc}"]) from None

    via, proxy_command = None, None
    jump, command = answer.one("proxyjump"), answer.one("proxycommand")
    if jump is not None and jump.lower() != "none":
        if depth >= MAX_JUMPS:
            raise InputError([f"{where}: ProxyJump chain longer than {MAX_JUMPS} hops"])
        extra, _, last = expanded("ProxyJump", jump, proxy=True).rpartition(",")
        jump_user, jump_host, jump_port = _jump_target(last, where)
        if (jump_host, jump_port or 22, jump_user or user) == (hostname, port, user):
            raise InputError([f"{where}: ProxyJump {printable(jump, 120)}: OpenSSH refuses it: jumphost loop"])
        hop = Query(jump_host, jump_user, jump_port, extra or None, query.config)
        via = _resolve(hop, last, local, environ, depth + 1)
    elif command is not None and command.lower() != "none":
        proxy_command = expanded("ProxyCommand", command, proxy=True)
    identity_files = tuple(expanded("IdentityFile", value) for value in answer.all("identityfile"))
    rules = _rules(answer, resolver.defaults())
    return Endpoint(
        destination=shown,
        alias=query.host,
        host=hostname,
        port=port,
        user=user,
        identity_files=identity_files,
        certificate_files=tuple(expanded("CertificateFile", value) for value in answer.all("certificatefile")),
        identities_only=answer.one("identitiesonly") == "yes",
        identity_agent=_agent(answer.one("identityagent"), environ),
        host_key_alias=connection.host_key_alias,
        proxy_command=proxy_command,
        via=via,
        connect_timeout=_connect_timeout(answer),
        address_family=answer.one("addressfamily") or "any",
        bind_address=answer.one("bindaddress"),
        algorithms=rules.algorithms,
        auth_methods=rules.auth_methods,
        auth_off=rules.auth_off,
        compression=answer.one("compression") == "yes",
        tcp_keepalive=answer.one("tcpkeepalive") != "no",
        not_applied=rules.not_applied,
        refusals=(*rules.refusals, *identities.refusals(identity_files)),
        config=query.config,
        query=query,
    )  # fmt: skip


@dataclass(frozen=True)
class _Rules:
    """What policy.py makes of one answer (the same for every resolve that answer serves)."""

    refusals: tuple[Refusal, ...]
    not_applied: tuple[NotApplied, ...]
    algorithms: Algorithms
    auth_methods: tuple[str, ...]
    auth_off: dict[str, tuple[str, str]]


@functools.lru_cache(maxsize=4096)
def _rules(answer: Answer, defaults: Answer) -> _Rules:
    return _Rules(
        tuple(policy.refusals(answer)),
        policy.not_applied(answer, defaults),
        policy.algorithms(answer, defaults),
        policy.auth_methods(answer),
        policy.auth_off(answer),
    )


def _agent(value: str | None, environ: Mapping[str, str]) -> str | None:
    """The agent socket OpenSSH uses: IdentityAgent's path, `none`, `SSH_AUTH_SOCK` or `$NAME` (a variable
    holding the path; unset means no agent), else SSH_AUTH_SOCK."""
    if value is None or value == "SSH_AUTH_SOCK":
        return environ.get("SSH_AUTH_SOCK") or None
    if value == "none":
        return None
    if value.startswith("$") and not value.startswith("${"):
        return environ.get(value[1:]) or None
    return value


def _port_of(answer: Answer, where: str) -> int:
    text = answer.one("port") or "22"
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InputError([f"{where}: OpenSSH answered port {printable(text, 20)}"])
    return int(text)


def _connect_timeout(answer: Answer) -> int | None:
    text = answer.one("connecttimeout") or "none"
    return int(text) if text.isdigit() else None


def _jump_target(text: str, where: str) -> tuple[str | None, str, int | None]:
    """The last ProxyJump hop as `ssh -G` prints it: `[user@]host[:port]`, an IPv6 host in brackets."""
    user, _, hostport = text.rpartition("@")
    try:
        host, port = _host_port(hostport, allow_plain_port=True)
    except InputError:
        raise InputError([f"{where}: ProxyJump hop {printable(text, 120)} is not [user@]host[:port]"]) from None
    return (user or None), host, port


def _host_port(text: str, *, allow_plain_port: bool) -> tuple[str, int | None]:
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise InputError([NOT_A_DESTINATION])
        return host, (_port(rest[1:]) if rest else None)
    if allow_plain_port and text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(port)
    return text, None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InputError(["destination: port must be 1..65535"])
    return int(text)

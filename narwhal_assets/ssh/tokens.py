"""OpenSSH's expansion of the values `ssh -G` prints unexpanded, with OpenSSH 9.2's rules and values.

`ssh -G` expands HostName, IdentityAgent, ControlPath and UserKnownHostsFile itself, but prints IdentityFile,
CertificateFile and ProxyCommand (and a ProxyJump's parts, which OpenSSH expands as part of the ProxyCommand it
builds from them) as written: OpenSSH expands those only when it connects. The rules (misc.c `tilde_expand`,
`percent_dollar_expand`; ssh.c's connection info; sshconnect.c `expand_proxy_command`):

- files (IdentityFile, CertificateFile): a leading `~` or `~user` first (the account's home from the password
  database, not `$HOME`; `~` alone is the home with a trailing `/`), then one left-to-right pass over `${NAME}`
  (an environment variable; unset is an error) and `%x` tokens: `%% %C %d %h %i %k %L %l %n %p %r %u`;
- ProxyCommand and a ProxyJump's parts: the tokens `%% %h %k %n %p %r` only, no `~` and no `${}` (the shell
  that runs the command sees those).

Anything OpenSSH refuses (an unknown token, a `%` at the end, an unset or unterminated `${`, an unknown
`~user`) raises `ExpansionError`: OpenSSH exits on it, so the host is refused, never connected differently.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import socket
from collections.abc import Mapping
from dataclasses import dataclass

FILE_TOKENS = frozenset("CdhikLlnpru")
PROXY_TOKENS = frozenset("hknpr")


class ExpansionError(ValueError):
    """OpenSSH would refuse this value (the message says why, without the environment's values)."""


@dataclass(frozen=True)
class LocalAccount:
    """Who and where this process runs, as OpenSSH reads it (`%u %i %d %l %L`, `~`)."""

    uid: int
    user: str
    home: str
    hostname: str

    @classmethod
    def current(cls) -> LocalAccount:
        """This process's account (its password entry is read once per process: a lookup costs about
        0.25 ms where the password database is long) and the host name now."""
        uid = os.getuid()
        user, home = _account(uid)
        return cls(uid, user, home, socket.gethostname())


@functools.cache
def _account(uid: int) -> tuple[str, str]:
    entry = pwd.getpwuid(uid)
    return entry.pw_name, entry.pw_dir


@dataclass(frozen=True)
class Connection:
    """The values of one connection's tokens: the resolved host name, port and remote user, the destination's
    host as given (`%n`) and the HostKeyAlias, if any (`%k` falls back to `%n`)."""

    hostname: str
    port: int
    user: str
    host_arg: str
    host_key_alias: str | None

    def tokens(self, local: LocalAccount) -> dict[str, str]:
        port = str(self.port)
        return {
            "C": hashlib.sha1(
                (local.hostname + self.hostname + port + self.user).encode(), usedforsecurity=False
            ).hexdigest(),
            "d": local.home,
            "h": self.hostname,
            "i": str(local.uid),
            "k": self.host_key_alias or self.host_arg,
            "L": local.hostname.split(".", 1)[0],
            "l": local.hostname,
            "n": self.host_arg,
            "p": port,
            "r": self.user,
            "u": local.user,
        }


def expand_file(value: str, connection: Connection, local: LocalAccount, environ: Mapping[str, str]) -> str:
    """An IdentityFile or CertificateFile value as OpenSSH opens it."""
    tokens = connection.tokens(local)
    return expand(tilde(value, local), {k: v for k, v in tokens.items() if k in FILE_TOKENS}, environ)


def expand_proxy(value: str, connection: Connection, local: LocalAccount) -> str:
    """A ProxyCommand (or a ProxyJump part) as OpenSSH hands it to the shell (without its `exec ` prefix)."""
    tokens = connection.tokens(local)
    return expand(value, {k: v for k, v in tokens.items() if k in PROXY_TOKENS}, None)


def tilde(value: str, local: LocalAccount) -> str:
    """OpenSSH's `tilde_expand`: `~`, `~/path`, `~user`, `~user/path`; anything else unchanged."""
    if not value.startswith("~"):
        return value
    user, slash, path = value[1:].partition("/")
    if user:
        try:
            home = pwd.getpwnam(user).pw_dir
        except KeyError:
            raise ExpansionError(f"no such user {user!r} for ~{user}") from None
    else:
        home = local.home
    path = path.lstrip("/") if slash else ""
    return home + ("" if home.endswith("/") else "/") + path


def expand(value: str, tokens: Mapping[str, str], environ: Mapping[str, str] | None) -> str:
    """One left-to-right pass: `%%` is `%`, `%x` a token, `${NAME}` a variable when `environ` is given (else
    literal); what a token or variable brings in is not expanded again."""
    out: list[str] = []
    i, end = 0, len(value)
    while i < end:
        ch = value[i]
        if ch == "$" and environ is not None and value.startswith("${", i):
            close = value.find("}", i + 2)
            if close < 0:
                raise ExpansionError("a ${ without its closing }")
            name = value[i + 2 : close]
            if name not in environ:
                raise ExpansionError(f"environment variable ${{{name}}} has no value")
            out.append(environ[name])
            i = close + 1
        elif ch == "%":
            if i + 1 >= end:
                raise ExpansionError("a % at the end")
            key = value[i + 1]
            if key == "%":
                out.append("%")
            elif key in tokens:
                out.append(tokens[key])
            else:
                raise ExpansionError(f"unknown token %{key}")
            i += 2
        else:
            nxt = min((p for p in (value.find("%", i), value.find("$", i)) if p >= 0), default=end)
            if nxt == i:  # a `$` not starting `${`, or with no environment
                nxt = i + 1
            out.append(value[i:nxt])
            i = nxt
    return "".join(out)

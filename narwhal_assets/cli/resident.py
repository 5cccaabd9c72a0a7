"""Where the preloaded process listens, and the messages a command exchanges with it (standard library only).

`deploy-hosts preload start` keeps one process per user and environment with Dagster and the commands'
modules already imported (`cli/preload_server.py`): a command then forks from it instead of spending a
second or more importing them, as OpenSSH's ControlMaster saves the handshake. The executable asks it
here before importing anything heavy (`cli/entry.py`), so this module imports only the standard library.

A server is only ever used by a command that would have run exactly as it does:
- **the same program**: the key names the interpreter, its prefix and this package's directory, and the
  server refuses (and ends) once a module it loaded changed on disk or a package was installed or removed;
- **the same environment**: every variable is in the key except the shell's own bookkeeping (`PWD`,
  `OLDPWD`, `_`, `SHLVL`), so a command run with another `DAGSTER_HOME`, `PATH` or `NARWHAL_ROOT` simply
  runs in its own process; the forked child then takes the command's exact environment, working
  directory, umask, descriptor limits, signal dispositions and standard streams (passed as descriptors);
- **the same user**: the socket sits in a directory only the user can enter (`$XDG_RUNTIME_DIR`, else
  `/tmp/narwhal-assets-<uid>`, refused unless it is a real directory owned by the user with mode 0700), and
  the server checks the peer's uid on every connection.

Only batch commands are passed on (`FORWARDED`); `shell`, `tunnel` and `ui` need the terminal as their
controlling terminal or run for hours, and `preload` manages the server itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import stat
import sys
from collections.abc import Mapping
from typing import Any

FORWARDED = frozenset({"plan", "discover", "prepare", "check-access", "trust", "resolve", "install", "rollback",
                       "status", "prune", "lease", "lock"})  # fmt: skip
VOLATILE = frozenset({"PWD", "OLDPWD", "_", "SHLVL"})
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # passed on to the command's group
MESSAGE_MAX = 1 << 20
HANDSHAKE_S = 5.0
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # narwhal_assets/, as loaded


class PreloadError(Exception):
    """The preload directory or server cannot be used; the message names it."""


Environ = Mapping[str, str]  # os.environ, or the environment a command will run with


def runtime_dir(environ: Environ) -> str:
    """The private directory holding the sockets (made 0700 if missing); `PreloadError` unless it is a real
    directory owned by this user that nobody else can enter."""
    uid = os.getuid()
    base = environ.get("XDG_RUNTIME_DIR") or "/tmp"
    path = os.path.join(base, "narwhal-assets") if base != "/tmp" else f"/tmp/narwhal-assets-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PreloadError(f"{path}: {exc.strerror}") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise PreloadError(f"{path}: not a directory owned by uid {uid} with mode 0700; not used")
    return path


def key(environ: Environ) -> str:
    """What a server and a command must share: the program (interpreter, prefix, this package) and the
    environment apart from the shell's bookkeeping."""
    program = [os.path.realpath(sys.executable), sys.prefix, PACKAGE_DIR, os.getuid()]
    env = sorted((k, v) for k, v in environ.items() if k not in VOLATILE)
    return hashlib.sha256(json.dumps([program, env]).encode()).hexdigest()[:24]


def socket_path(environ: Environ) -> str:
    return os.path.join(runtime_dir(environ), f"preload-{key(environ)}.sock")


def lock_path(sock: str) -> str:
    """Held (`flock`) by the live server for its whole life: free means no server, whatever files are left."""
    return sock[: -len(".sock")] + ".lock"


def send(conn: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(conn, [data], fds)
    else:
        conn.send(data)


def receive(conn: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors sent with it; `None` at the end of the connection."""
    data, fds, _flags, _addr = socket.recv_fds(conn, MESSAGE_MAX, 3)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("not a message")
    return message, fds


def connect(sock: str) -> socket.socket | None:
    """A connection to the server at `sock`, or `None` when there is none listening."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.settimeout(HANDSHAKE_S)
    try:
        conn.connect(sock)
    except OSError:
        conn.close()
        return None
    return conn


def ask(environ: Environ, request: dict[str, Any]) -> dict[str, Any] | None:
    """One question to this environment's server (`status`, `stop`) and its answer; `None` when none runs."""
    conn = connect(socket_path(environ))
    if conn is None:
        return None
    with conn:
        try:
            send(conn, request)
            answer, _ = receive(conn)
        except (OSError, ValueError):
            return None
    return answer


def dispositions() -> dict[str, str]:
    """How this process treats each passed-on signal (`ignored` or `default`), for the child to copy."""
    return {str(int(s)): "ignored" if signal.getsignal(s) == signal.SIG_IGN else "default" for s in SIGNALS}


def limits() -> dict[str, list[int]]:
    """The descriptor limit (the one a fleet operation depends on), for the child to copy."""
    return {"nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE))}

"""The `deploy-hosts` executable: the command runs in a child of this environment's preloaded process when
one is listening (`deploy-hosts preload start`), else here, as it always did.

Nothing heavy is imported before that choice (`cli/resident.py` is the standard library). A passed-on
command gets this process's standard streams as descriptors and writes to them itself; this process waits,
passes on SIGINT, SIGTERM, SIGHUP and SIGQUIT to the command's process group, and ends with the command's
exit status (or by the signal that ended it). If this process is killed, the server kills the command, as
killing a command run here would. The command starts only after this process has said go, so when the
server does not answer in time the command runs here instead, never twice.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from contextlib import suppress
from typing import Any

from narwhal_assets.cli import resident

EXIT_FAILED = 1


def command() -> int:
    code = forward(sys.argv[1:])
    if code is not None:
        return code
    from narwhal_assets.cli.main import command as in_process

    return in_process()


def verb(argv: list[str]) -> str | None:
    """The command word (`--root DIR` may come first); `None` for `--help` and the like."""
    rest = iter(argv)
    for word in rest:
        if word == "--root":
            next(rest, None)
        elif not word.startswith("--root="):
            return None if word.startswith("-") else word
    return None


def forward(argv: list[str]) -> int | None:
    """The passed-on command's exit status, or `None` when it must run in this process (no server for this
    environment, a command that is not passed on, a server that refused or did not answer)."""
    if verb(argv) not in resident.FORWARDED:
        return None
    try:
        conn = resident.connect(resident.socket_path(os.environ))
    except resident.PreloadError:
        return None
    if conn is None:
        return None
    with conn:
        try:
            if not _ready(conn, argv):
                return None
        except (OSError, ValueError):
            return None
        return _wait(conn)


def _ready(conn: socket.socket, argv: list[str]) -> bool:
    """Whether the server is ready to fork the command (`False`: it refused, or is gone, and ran nothing)."""
    request: dict[str, Any] = {"run": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
                               "signals": resident.dispositions(), "limits": resident.limits()}  # fmt: skip
    resident.send(conn, request, [0, 1, 2])
    answer, _ = resident.receive(conn)
    return bool(answer and "ready" in answer)


def _wait(conn: socket.socket) -> int | None:
    """Say go, then pass signals on until the command ends; `None` only when the server answers that it
    could not start it. Past go nothing falls back to this process: a command that may have started is
    never run a second time."""

    def pass_on(signum: int, _frame: object) -> None:
        with suppress(OSError):
            resident.send(conn, {"signal": signum})

    before = {signum: signal.getsignal(signum) for signum in resident.SIGNALS}
    for signum, disposition in before.items():
        if disposition != signal.SIG_IGN:
            signal.signal(signum, pass_on)  # queued until the server watches the child, then sent to its group
    conn.settimeout(None)
    try:
        resident.send(conn, {"go": True})
    except OSError:
        return _lost()
    while True:
        try:
            message, _ = resident.receive(conn)
        except (OSError, ValueError):
            message = None
        if message is None:
            return _lost()
        if "refused" in message:
            for signum, disposition in before.items():
                signal.signal(signum, disposition)
            return None
        if "exit" in message:
            return int(message["exit"])
        if "killed" in message:
            ended_by = int(message["killed"])
            signal.signal(ended_by, signal.SIG_DFL)
            os.kill(os.getpid(), ended_by)
            return 128 + ended_by


def _lost() -> int:
    print("deploy-hosts: error: the preloaded process ended before the command did", file=sys.stderr)
    return EXIT_FAILED


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask

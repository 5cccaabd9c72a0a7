"""Command guard: runs on a fleet host as `python3 -I -S -c <this source> LIMIT_S /bin/sh -c COMMAND`, or as
`python3 -I -S -c <this source> LIMIT_S -` for one of this package's host programs.

sshd does not stop a non-interactive command when its channel closes or its client vanishes, and a tool
killed on timeout can leave its own children behind. The transport therefore runs every remote command
under this guard, which starts the command as a new process group and kills that whole group
with SIGKILL when any of these happens first:

- the command exits (nothing it started in the background outlives it),
- the channel goes away: sshd closes our stdout pipe, which poll() reports as POLLERR/POLLHUP,
- LIMIT_S seconds pass (a backstop for a link that was cut, where no close ever arrives): exit 124,
- the guard receives SIGTERM, SIGHUP or SIGINT.

With `-` the command is a Python program on stdin, framed as `<length>\\n<ASCII source>` and followed by the
program's own input. The guard's forked child runs it in the guard's own interpreter, as `python3 -I -S`
would run it in a fresh one: same flags, signal dispositions and `__main__` namespace, exit status from
`SystemExit`. So a program costs the host one interpreter start, not two (6-20 ms less of the host's CPU
per call, measured on a `status` of the installer).

Standard library only, Python 3.8+, ASCII source; it never reads stdin (the command, or the program after
its source, inherits it). Run with `-c`, it has no `from __future__` import: annotations that Python 3.8
cannot evaluate are quoted. It imports only what a fresh `-I -S` interpreter has already loaded, plus `select`
and `signal` (no `contextlib`: its import cost the host more than the guard's own code).
"""

import builtins
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` on every host
if TYPE_CHECKING:
    from collections.abc import Callable

TIMED_OUT = 124
CHANNEL_GONE = 129  # as if hung up: nobody reads this status any more
GONE = select.POLLERR | select.POLLHUP
PROGRAM = "-"  # the command is the Python program on stdin
SOURCE_LENGTH_DIGITS = 32  # the length line's bound: a host program is never near 10**31 bytes


class ProgramChild(BaseException):
    """Raised in the forked child of `-`: unwinds the guard's frames, so the program runs at the top level
    and ends as a fresh interpreter ends (its `SystemExit`, its threads joined, its streams flushed)."""


def _status(raw: int) -> int:
    if os.WIFEXITED(raw):
        return os.WEXITSTATUS(raw)
    return 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else 1


def _ignoring(error: "type[BaseException]", call: "Callable[..., object]", *args: object) -> None:
    """`call(*args)` with `error` ignored: `contextlib.suppress` without its import (4 ms of each host call)."""
    try:  # noqa: SIM105 (that import is what this avoids)
        call(*args)
    except error:
        pass


def _kill_group(pgid: int) -> None:
    _ignoring(OSError, os.killpg, pgid, signal.SIGKILL)


def _start(argv: "list[str]") -> int:
    """Fork; the child leads a new process group (set on both sides: no race with a kill), then execs argv
    or, for `-`, raises `ProgramChild`."""
    pid = os.fork()
    if pid == 0:
        if argv != [PROGRAM]:
            try:
                os.setpgid(0, 0)
                for ignored_by_python in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(ignored_by_python, signal.SIG_DFL)
                os.execvp(argv[0], argv)
            finally:
                os._exit(127)
        os.setpgid(0, 0)
        raise ProgramChild()
    _ignoring(OSError, os.setpgid, pid, pid)  # fails only when the child already exec'd, its group set by itself
    return pid


def _say(text: str) -> None:
    _ignoring(OSError, sys.stderr.write, text)
    _ignoring(OSError, sys.stderr.flush)


def guard(limit: float, argv: "list[str]") -> int:
    """Run argv in its own process group; return its exit status (124 when the limit passed)."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stop: list[int] = []
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    deadline = time.monotonic() + limit
    try:
        pid = _start(argv)
    except ProgramChild:
        _as_fresh_interpreter(wake_read, wake_write)
        raise
    poller = select.poll()
    poller.register(wake_read, select.POLLIN)
    poller.register(1, 0)  # no events requested: poll still reports POLLERR/POLLHUP on our stdout
    status = None
    while status is None and not stop:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = _status(raw)
            break
        left = deadline - time.monotonic()
        if left <= 0:
            status = TIMED_OUT
            _say(f"narwhal guard: command did not finish within {limit:.0f} s; stopped it\n")
            break
        events = poller.poll(int(left * 1000) + 1)
        if any(fd == 1 and mask & GONE for fd, mask in events):
            status = CHANNEL_GONE
        for fd, _ in events:
            if fd == wake_read:
                os.read(wake_read, 512)
    _kill_group(pid)
    _ignoring(ChildProcessError, os.waitpid, pid, 0)
    return status if status is not None else 128 + stop[0]


def _as_fresh_interpreter(wake_read: int, wake_write: int) -> None:
    """Undo in the child what the guard set up: the signal handlers and wake-up pipe of a fresh interpreter."""
    signal.set_wakeup_fd(-1)
    os.close(wake_read)
    os.close(wake_write)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)


def run_program() -> None:
    """Read the framed program from stdin and run it as `__main__` (what follows stays on stdin for it)."""
    length = int(sys.stdin.buffer.readline(SOURCE_LENGTH_DIGITS))
    code = compile(sys.stdin.buffer.read(length), "narwhal-program", "exec", dont_inherit=True)
    sys.argv[:] = ["-c"]
    exec(code, {"__name__": "__main__", "__builtins__": builtins})  # noqa: S102 (the workstation's own program)


if __name__ == "__main__":
    try:  # noqa: SIM105 (no contextlib here)
        sys.exit(guard(float(sys.argv[1]), sys.argv[2:]))
    except ProgramChild:  # only in the forked child of `-`, the guard's frames gone: the program runs next
        pass
    run_program()

"""Command guard: runs on a fleet host as `python3 -c <this source> LIMIT_S /bin/sh -c COMMAND`.

sshd does not stop a non-interactive command when its channel closes or its client vanishes, and a tool
killed on timeout can leave its own children behind. The transport therefore runs every remote command
under this guard, which starts the command as a new process group and kills that whole group
with SIGKILL when any of these happens first:

- the command exits (nothing it started in the background outlives it),
- the channel goes away: sshd closes our stdout pipe, which poll() reports as POLLERR/POLLHUP,
- LIMIT_S seconds pass (a backstop for a link that was cut, where no close ever arrives): exit 124,
- the guard receives SIGTERM, SIGHUP or SIGINT.

Standard library only, Python 3.8+, ASCII source; it never reads stdin (the command inherits it). Run with
`-c`, it has no `from __future__` import: annotations that Python 3.8 cannot evaluate are quoted.
"""

import contextlib
import os
import select
import signal
import sys
import time

TIMED_OUT = 124
CHANNEL_GONE = 129  # as if hung up: nobody reads this status any more
GONE = select.POLLERR | select.POLLHUP


def _status(raw: int) -> int:
    if os.WIFEXITED(raw):
        return os.WEXITSTATUS(raw)
    return 128 + os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else 1


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def _start(argv: "list[str]") -> int:
    """Fork and exec argv as the leader of a new process group (set on both sides: no race with a kill)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for ignored_by_python in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(ignored_by_python, signal.SIG_DFL)
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    with contextlib.suppress(OSError):  # fails only when the child already exec'd, its group set by itself
        os.setpgid(pid, pid)
    return pid


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text)
        sys.stderr.flush()


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
    pid = _start(argv)
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
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return status if status is not None else 128 + stop[0]


if __name__ == "__main__":
    sys.exit(guard(float(sys.argv[1]), sys.argv[2:]))

"""Running the OpenSSH of `shell` and `tunnel`: exec'd, or as a child that leaves nothing behind.

`shell` execs it (the terminal, signals and exit status are OpenSSH's own). `tunnel` runs it as a child and
stays until it ends: ssh ends a ProxyCommand/ProxyJump hop only by a SIGHUP that is lost when the hop ignores
SIGHUP (inherited from `nohup` or a CI runner) or receives it before it has set its handler, and a hop left
behind keeps the tunnel's stdout and stderr open for minutes. So `run_openssh` takes every process ssh leaves
behind as its own (PR_SET_CHILD_SUBREAPER) and ends them when ssh ends; SIGTERM, SIGINT and SIGHUP go on to ssh
(one this process was started with ignored stays ignored, as ssh would keep it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType
from typing import NoReturn

from narwhal_assets.ssh.openssh import OpenSshCommand

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 2.0  # what ssh left behind gets SIGTERM, then SIGKILL after this long


def exec_openssh(command: OpenSshCommand) -> NoReturn:
    """Replace this process with OpenSSH, so the terminal, signals and exit status are its own."""
    command.prepare_password_pipe()
    os.execvp(command.argv[0], command.argv)


def run_openssh(command: OpenSshCommand) -> int:
    """Run OpenSSH as a child, pass it SIGTERM/SIGINT/SIGHUP, and end whatever it left running when it ends;
    its exit status (128+N when a signal N ended it)."""
    command.prepare_password_pipe()
    _become_subreaper()
    process: subprocess.Popen[bytes] | None = None
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if process is not None and process.returncode is None:
            process.send_signal(signum)

    # One ignored when this process started (`nohup`) stays ignored, for ssh too, as ssh itself does; the others
    # get a Python handler, so ssh starts with them at their default disposition.
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS
                if signal.getsignal(signum) != signal.SIG_IGN}  # fmt: skip
    try:
        process = subprocess.Popen(command.argv, pass_fds=command.pass_fds)
        for fd in command.pass_fds:
            os.close(fd)  # sshpass has its own copy of the password pipe
        if received:  # a signal that came before ssh existed
            process.send_signal(received[0])
        rc = process.wait()
    finally:
        _end_leftovers()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - rc if rc < 0 else rc


def _become_subreaper() -> None:
    """Orphans of ssh (its ProxyCommand/ProxyJump hops) become this process's children, not init's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _children() -> list[int]:
    """This process's live children (ssh's orphans among them), from /proc/<pid>/task/*/children."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(found)


def _end_leftovers() -> None:
    """SIGTERM to every child still here, SIGKILL to those alive after LEFTOVER_GRACE_S; all reaped."""
    deadline, sent = time.monotonic() + LEFTOVER_GRACE_S, signal.SIGTERM
    while children := _children():
        for pid in children:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    os.kill(pid, sent)
            except (ChildProcessError, ProcessLookupError):
                continue
        if time.monotonic() >= deadline:
            sent = signal.SIGKILL
        time.sleep(0.05)

"""The command guard run locally, as a host runs it (`python3 -c <source> LIMIT /bin/sh -c COMMAND`, or `LIMIT -`
with a framed program on stdin): the command's status passes through, and its whole process group dies when it
exits, when its time is up or when the reader of its stdout goes away (tests/fleet/test_faults.py checks the
same through real sshd). A program runs in the guard's forked child as a fresh `python3 -I -S` would run it."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.host_program import run_host_program

from narwhal_assets.host import program_stream
from narwhal_assets.ssh.transport import guard_argv, guard_source


def guard(limit: float, command: str, **kwargs: object) -> subprocess.Popen[bytes]:
    argv = ["python3", "-c", guard_source(), str(limit), "/bin/sh", "-c", command]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def program(limit: float, script: str, payload: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """The guard in `-` mode, exactly as the transport starts it, with the framed `script` and `payload` sent."""
    return run_host_program(program_stream(script, [payload]), os.environ, limit)


def processes(marker: str) -> list[str]:
    found = []
    for proc in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = proc.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in argv and "python3 -c" not in argv:
            found.append(argv)
    return found


def none_left(marker: str, patience: float = 10.0) -> bool:
    deadline = time.monotonic() + patience
    while processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not processes(marker)


def marker_sleep() -> str:
    """A `sleep` command whose argv is unique to this test: `sleep 4000.<random>`."""
    return f"sleep 4000.{secrets.randbelow(10**6):06d}"


def test_status_and_output_pass_through() -> None:
    proc = guard(30, "echo out; echo err >&2; exit 7")
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (7, b"out\n", b"err\n")


def test_background_processes_die_with_the_command() -> None:
    sleep = marker_sleep()
    proc = guard(30, f"{sleep} & echo started")
    assert proc.communicate(timeout=30)[0] == b"started\n" and proc.returncode == 0
    assert none_left(sleep)


def test_the_limit_stops_the_whole_group_with_124() -> None:
    sleep = marker_sleep()
    proc = guard(1, f"{sleep} & {sleep}")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 124 and b"did not finish within 1 s" in err
    assert none_left(sleep)


def test_a_closed_reader_stops_the_whole_group() -> None:
    sleep = marker_sleep()
    proc = guard(600, f"{sleep} & {sleep}")
    assert proc.stdout is not None
    deadline = time.monotonic() + 10
    while len(processes(sleep)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.stdout.close()  # what sshd does when the channel closes
    assert proc.wait(timeout=30) == 129
    assert none_left(sleep)


def test_a_terminated_guard_takes_its_group_along() -> None:
    sleep = marker_sleep()
    proc = guard(600, f"{sleep}")
    deadline = time.monotonic() + 10
    while not processes(sleep) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + 15
    assert none_left(sleep)


FRESH = """import os, signal, sys
print(sys.argv, __name__, sys.flags.isolated, sys.flags.no_site)
signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)
print([str(signal.getsignal(s)) for s in signals])
print(signal.set_wakeup_fd(-1), sys.stdin.buffer.read())
print("leads its group", os.getpgid(0) == os.getpid())
"""


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["signals default", "signals ignored"])
def test_a_program_runs_as_a_fresh_isolated_interpreter_would_and_reads_the_rest_of_stdin(
    inherited: signal.Handlers,
) -> None:
    """The reference is what hosts ran before: the guard starting `python3 -I -S` through the shell. Whatever
    the guard inherited (sshd gives defaults; a shell's `cmd &` or nohup ignores SIGINT or SIGHUP), both see
    the same dispositions: the guard's own handlers are reset in its child, as exec resets them."""

    def inheriting() -> None:
        for number in (signal.SIGINT, signal.SIGHUP):
            signal.signal(number, inherited)

    stream = program_stream(FRESH, [b"the input"])
    fresh = " ".join(["python3", "-I", "-S", "-c", shlex.quote(FRESH)])
    runs = [subprocess.run(guard_argv(30, command), input=stream if command is None else b"the input",
                           capture_output=True, timeout=30, preexec_fn=inheriting) for command in (None, fresh)]
    lines, expected = (run.stdout.decode().splitlines() for run in runs)
    assert runs[0].stderr == b"" and lines[0] == "['-c'] __main__ 1 1" and lines[-1] == "leads its group True"
    assert lines[:-1] == expected[:-1], "signal dispositions, wake-up fd or stdin differ from a fresh interpreter's"


def test_a_program_s_exit_status_and_threads_end_as_in_a_fresh_interpreter() -> None:
    script = "import sys, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), print('joined'))).start()"
    script += "\n"
    for ending, status, err in (("sys.exit(3)", 3, b""), ("sys.exit('no such thing')", 1, b"no such thing\n"),
                                ("raise ValueError('boom')", 1, b"ValueError: boom\n")):  # fmt: skip
        done = program(30, script + ending)
        assert (done.returncode, done.stdout) == (status, b"joined\n") and done.stderr.endswith(err), ending


def test_a_program_s_background_processes_die_with_it_and_the_limit_stops_it() -> None:
    sleep = marker_sleep()
    started = f"import subprocess\nsubprocess.Popen({sleep.split()!r})\nprint('started')\n"
    done = program(30, started)
    assert (done.returncode, done.stdout) == (0, b"started\n")
    assert none_left(sleep)
    done = program(1, f"import subprocess\nsubprocess.run({sleep.split()!r})\n")
    assert done.returncode == 124 and b"did not finish within 1 s" in done.stderr
    assert none_left(sleep)

"""`deploy-hosts preload start|status|stop`: keep a process with Dagster loaded, so each command skips the import.

A command's fixed cost is mostly importing Dagster (about 1.2 CPU-s). After `preload start`, `deploy-hosts`
commands run from the same environment (same variables, same interpreter) are forked from a process that
has already imported it (`cli/preload_server.py`) and behave as before: same output, exit status, files and
Dagster records, written before the command returns. The process holds no instance, connection or secret;
it ends after `--idle` minutes without a command, on `preload stop`, or when the program changes on disk.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import selectors
import subprocess
import sys
import time

from narwhal_assets.cli import resident
from narwhal_assets.core.errors import InputError, NarwhalError

NONE = "no preloaded process serves this environment"
START_S = 120.0  # the imports on a busy 2-CPU machine take seconds; this bounds a wedged start


def run(args: argparse.Namespace) -> int:
    try:
        return {"start": _start, "status": _status, "stop": _stop}[args.action](args)
    except resident.PreloadError as exc:
        raise InputError([str(exc)]) from None


def _start(args: argparse.Namespace) -> int:
    running = resident.ask(os.environ, {"status": True})
    if running is not None:
        print(f"a preloaded process (pid {running['pid']}) already serves this environment")
        return 0
    resident.runtime_dir(os.environ)  # its errors, before a process is started
    argv = [sys.executable, "-P", "-m", "narwhal_assets.cli.preload_server", "--idle", str(args.idle * 60)]
    proc = subprocess.Popen(argv, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if selector.select(START_S) else b""
    if not line.strip():
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        lines = proc.stderr.read().decode(errors="replace").strip().splitlines()
        raise NarwhalError(lines[-1] if lines else f"the preloaded process did not start within {START_S:.0f} s")
    proc.stdout.close()
    proc.stderr.close()
    pid = json.loads(line)["ready"]
    print(f"preloaded process {pid} serves deploy-hosts commands from this environment; it exits after "
          f"{args.idle:g} idle minutes or `deploy-hosts preload stop`")  # fmt: skip
    return 0


def _status(_args: argparse.Namespace) -> int:
    answer = resident.ask(os.environ, {"status": True})
    if answer is None:
        print(NONE)
        return 1
    since = datetime.datetime.fromtimestamp(answer["started_at"]).astimezone().isoformat(timespec="seconds")
    print(f"preloaded process {answer['pid']} since {since}: {answer['served']} commands served, "
          f"{answer['running']} running, exits after {answer['idle_s'] / 60:g} idle minutes")  # fmt: skip
    return 0


def _stop(_args: argparse.Namespace) -> int:
    answer = resident.ask(os.environ, {"stop": True})
    if answer is None:
        print(NONE)
        return 0
    running = f" once its {answer['running']} running commands end" if answer["running"] else ""
    print(f"preloaded process {answer['stopping']} stops{running}")
    deadline = time.monotonic() + 5
    while answer["running"] == 0 and time.monotonic() < deadline and _alive(int(answer["stopping"])):
        time.sleep(0.02)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, and belongs to someone else now
    return True


def _minutes(text: str) -> float:
    value = float(text)
    if not 0 < value <= 24 * 60:
        raise argparse.ArgumentTypeError("between 0 and 1440 minutes")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("preload", help="keep a process with Dagster loaded so commands start at once",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument("--idle", type=_minutes, default=30.0, metavar="MINUTES",
                        help="start: exit after this many minutes without a command (default 30)")  # fmt: skip
    parser.set_defaults(func=run)

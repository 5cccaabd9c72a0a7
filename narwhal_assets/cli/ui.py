"""`deploy-hosts ui [--port N] [--host ADDR]`: the Dagster UI (webserver and daemon) on this checkout's instance.

Dagster's `dagster dev` copies a `.env` in its working directory into its own environment, and every code
server and run worker it starts inherits that copy: started from a checkout, each would hold the
management passwords. So this command starts it from a new private, empty directory, with
`-m narwhal_assets.definitions`, `NARWHAL_ROOT` naming the checkout and `DAGSTER_HOME` its instance (whose
dagster.yaml is written first, as every command does), an environment without any password or destination
(`local.process_env`), umask 077, and bound to 127.0.0.1 unless `--host` says otherwise.

Dagster's console (its service lines, each run's DEBUG events, its own deprecation warnings) goes to
`<DAGSTER_HOME>/ui.log`, so the terminal shows the address and what this command does. Ctrl-C or SIGTERM stops
every process Dagster started (webserver, daemon, code server, run workers: one process group) within
seconds: an interrupt as Ctrl-C on `dagster dev` would be, then SIGKILL for whatever is still there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import suppress
from pathlib import Path
from types import FrameType

from narwhal_assets.core.errors import InputError, UiStopped

COMMAND = "ui"
DEFAULT_PORT = 3000
DEFAULT_HOST = "127.0.0.1"
LOCATION_MODULE = "narwhal_assets.definitions"
LOG_FILE = "ui.log"
# `dagster dev` warns on every start that `dg dev` supersedes it; `dg dev` starts the same services (and loads
# `.env` the same way), so the warning only adds noise. A literal message prefix: no other warning matches.
SUPERSEDED = "ignore:Function `dev_command` is superseded:FutureWarning"
READY_S = 180.0  # Dagster's first start imports the code location in three processes
GRACE_S = 8.0  # after the interrupt, before SIGKILL
GONE_S = 5.0  # after SIGKILL, for the kernel to reap the group
TAIL_BYTES = 3000


def port(text: str) -> int:
    """An argparse type: a TCP port 1..65535 (argparse exits 2 otherwise)."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError("expected a TCP port from 1 to 65535")
    return int(text)


def _check_free(host: str, number: int) -> None:
    """Bind the address once, so a port in use or an address not on this machine is exit 2 before anything starts."""
    try:
        infos = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise InputError([f"--host {host} --port {number}: cannot listen there ({exc.strerror or exc}); "
                          "choose another --port, or an address of this machine for --host"]) from None  # fmt: skip


def child_environment(root: Path, home: Path) -> dict[str, str]:
    """This process's environment for Dagster: without management access (named in a warning), with the
    checkout and the instance named."""
    from narwhal_assets.local.process_env import scrub_access_variables

    environ = dict(os.environ)
    scrub_access_variables(environ, root)
    warnings = ",".join(filter(None, [environ.get("PYTHONWARNINGS"), SUPERSEDED]))
    return {**environ, "NARWHAL_ROOT": str(root), "DAGSTER_HOME": str(home), "PYTHONWARNINGS": warnings}


def dagster_dev_argv(host: str, number: int) -> list[str]:
    return [sys.executable, "-m", "dagster", "dev", "-m", LOCATION_MODULE, "--host", host, "--port", str(number),
            "--log-level", "warning", "--code-server-log-level", "warning"]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.runtime.runner import instance_home

    _check_free(args.host, args.port)
    Checkout.open(args.root)  # a checkout that does not open would fail every run: say so now
    home = instance_home(args.root)
    url = f"http://{_reachable(args.host)}:{args.port}"
    log_path = home / LOG_FILE
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-ui-"))  # 0700, empty: no .env for Dagster to load
    stop = _StopOnSignals()
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                dagster_dev_argv(args.host, args.port), cwd=workdir, env=child_environment(args.root, home),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        print(f"deploy-hosts ui: starting Dagster for {args.root} (instance {home}, its log {log_path})", flush=True)
        try:
            return _serve(process, url, log_path, stop)
        finally:
            stop_group(process)
    finally:
        stop.restore()
        shutil.rmtree(workdir, ignore_errors=True)


def _serve(process: subprocess.Popen[bytes], url: str, log_path: Path, stop: _StopOnSignals) -> int:
    """Wait until the UI serves (say where), then until a signal or Dagster's own exit."""
    deadline, ready = time.monotonic() + READY_S, False
    while not stop.requested.wait(0.5):
        if process.poll() is not None:
            raise UiStopped(f"Dagster exited {process.returncode}; the end of {log_path}:\n{_tail(log_path)}")
        if not ready and _serving(url):
            ready = True
            print(f"deploy-hosts ui: serving {url} (Ctrl-C stops it)", flush=True)
        elif not ready and time.monotonic() > deadline:
            raise UiStopped(f"Dagster did not serve {url} within {READY_S:.0f}s; the end of {log_path}:\n"
                            f"{_tail(log_path)}")  # fmt: skip
    print(f"deploy-hosts ui: {stop.signal_name}: stopping Dagster", flush=True)
    return 0


def _reachable(host: str) -> str:
    """Where this machine reaches a server bound to `host` (the wildcard addresses: loopback)."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - naming the wildcard, not binding it
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:  # noqa: S310 - our own http URL
            return bool(response.status == 200)
    except OSError:
        return False


def _tail(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
        return handle.read().decode("utf-8", errors="replace")


class _StopOnSignals:
    """SIGINT and SIGTERM ask the main loop to stop Dagster (instead of leaving it running without us)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.signal_name = ""
        self.previous = {signum: signal.signal(signum, self._handle) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self.requested.set()

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Interrupt Dagster's process group as Ctrl-C would (each service shuts down its children), then SIGKILL
    whatever is left after GRACE_S; returns once no member is left (or GONE_S more have passed)."""
    group = process.pid
    for signum, wait_s in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, GONE_S)):
        with suppress(ProcessLookupError):
            os.killpg(group, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.1)
            if process.returncode is not None and not _group_alive(group):
                return


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs; zombies do not count (signal 0 would find them until
    init reaps them, though they hold nothing)."""
    return any(_live_member(stat, group) for stat in Path("/proc").glob("[0-9]*/stat"))


def _live_member(stat: Path, group: int) -> bool:
    try:
        fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == group


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(COMMAND, help="the Dagster UI and daemon on this checkout's instance (Ctrl-C stops both)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default=DEFAULT_HOST, metavar="ADDR",
                        help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")  # fmt: skip
    parser.set_defaults(func=run)

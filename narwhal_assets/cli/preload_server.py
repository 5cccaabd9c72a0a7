"""The preloaded process: Dagster and every command's modules imported once, one forked child per command.

Started by `deploy-hosts preload start` as `python -m narwhal_assets.cli.preload_server --idle S`. It loads
the modules (nothing else: no instance, no connection, no thread, no secret), holds its lock for life,
listens on its socket and serves one connection at a time until it has been idle for S seconds, is
stopped, or finds that the program changed on disk. For a command it forks; the child makes itself a
process group, takes the command's descriptors, directory, environment, umask, limits and signal
dispositions, and returns from `serve` to run `deploy-hosts` as a fresh process would (`__main__` below),
ending the way that process would. The server itself never runs a command: every child starts from the
same state, the one right after the imports, so nothing one command did is seen by the next.

The server watches each child: a signal the command's caller passes on goes to the child's group, the
caller's disappearance kills the group (as killing the caller kills a command run in place), and the
child's end goes back to the caller as its exit status or signal.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import importlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from narwhal_assets.cli import resident

# Imported before serving: what the commands import when they run (Dagster, its SQL storage and migrations,
# paramiko, the definitions), found by listing the modules a preloaded `install` and `status` still imported;
# the private Dagster modules are those its instance and `execute_in_process` load lazily (exact pin).
PRELOADED = ("dagster", "paramiko", "narwhal_assets.cli.main", "narwhal_assets.definitions",
             "narwhal_assets.runtime.runner", "narwhal_assets.runtime.instance_storage",
             "narwhal_assets.runtime.run_liveness", "narwhal_assets.local.forked", "narwhal_assets.workflows.status",
             "narwhal_assets.workflows.install", "narwhal_assets.defs.installation.status",
             "dagster._core.instance.factory", "dagster._core.execution.execute_in_process",
             "dagster._core.executor.in_process", "dagster._core.execution.plan.active",
             "dagster._core.storage.fs_io_manager", "dagster._core.storage.noop_compute_log_manager",
             "dagster._core.storage.root", "dagster._core.storage.migration.utils", "dagster._core.secrets.env_file",
             "dagster._core.definitions.repository_definition.repository_data_builder",
             "dagster._core.definitions.external_asset", "dagster._core.system_config.composite_descent",
             "dagster._core.instance.runs.run_domain", "upath")  # fmt: skip
PEERCRED = struct.Struct("3i")


@dataclass
class Child:
    pid: int
    conn: socket.socket
    pidfd: int
    caller_gone: bool = False  # its connection closed: no longer watched, nothing to report to


@dataclass
class Server:
    sock_path: str
    inode: int
    lock_fd: int
    wakeup: socket.socket
    wakeup_write: socket.socket
    idle_s: float
    fingerprint: list[tuple[str, int, int]]
    started_at: float = field(default_factory=time.time)
    served: int = 0
    stopping: bool = False
    children: dict[int, Child] = field(default_factory=dict)


def fingerprint() -> list[tuple[str, int, int]]:
    """What the loaded program is made of: each loaded module file of this package and each directory on
    `sys.path` (a package installed, upgraded or removed changes its entries), as path, mtime and size."""
    files = (getattr(module, "__file__", None) for module in list(sys.modules.values()))
    paths = {path for path in files if isinstance(path, str) and path.startswith(resident.PACKAGE_DIR)}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    marks = []
    for path in sorted(paths):
        try:
            info = os.stat(path)
        except OSError:
            marks.append((path, -1, -1))
            continue
        marks.append((path, info.st_mtime_ns, info.st_size))
    return marks


def serve(server: Server, listener: socket.socket) -> dict[str, Any]:
    """Serve until idle, stopped or stale (then exit); returns only in a forked child, with its request."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(server.wakeup, selectors.EVENT_READ, "wakeup")
    idle_since = time.monotonic()
    while True:
        if not server.children:
            if server.stopping:
                _exit(server)
            timeout = server.idle_s - (time.monotonic() - idle_since)
            if timeout <= 0:
                _exit(server)
        else:
            timeout = None
        for selected, _ in selector.select(timeout):
            kind = selected.data
            if kind == "wakeup":
                server.wakeup.recv(64)
            elif kind == "listener" and not server.stopping:
                request = _accept(server, listener, selector)
                if request is not None:  # the child
                    selector.close()
                    listener.close()
                    return request
            elif isinstance(kind, Child):
                if selected.fileobj is kind.conn:
                    _from_caller(selector, kind)
                else:
                    _ended(server, selector, kind)
                    idle_since = time.monotonic()
        if server.stopping and listener.fileno() >= 0:
            selector.unregister(listener)
            listener.close()
            _release(server)  # a new server may start while this one's commands finish


def _accept(server: Server, listener: socket.socket, selector: selectors.BaseSelector) -> dict[str, Any] | None:
    conn, _ = listener.accept()
    conn.settimeout(resident.HANDSHAKE_S)
    fds: list[int] = []
    try:
        _pid, uid, _gid = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
        if uid != os.getuid():
            conn.close()
            return None
        message, fds = resident.receive(conn)
        if message is None:
            conn.close()
            return None
        if "status" in message:
            resident.send(conn, {"pid": os.getpid(), "started_at": server.started_at, "served": server.served,
                                 "running": len(server.children), "idle_s": server.idle_s})  # fmt: skip
            conn.close()
            return None
        if "stop" in message:
            server.stopping = True
            resident.send(conn, {"stopping": os.getpid(), "running": len(server.children)})
            conn.close()
            return None
        if "run" not in message or len(fds) != 3:
            raise ValueError("not a command")
        if message["limits"]["nofile"][1] > resource.getrlimit(resource.RLIMIT_NOFILE)[1]:
            resident.send(conn, {"refused": "the caller's descriptor limit is above this server's"})
            raise ValueError("limits")
        if fingerprint() != server.fingerprint:
            server.stopping = True
            resident.send(conn, {"refused": "the program changed on disk since this server started"})
            raise ValueError("stale")
        resident.send(conn, {"ready": os.getpid()})
        go, _ = resident.receive(conn)
        if not go or "go" not in go:
            raise ValueError("no go")
    except (OSError, ValueError, KeyError, TypeError, struct.error):  # a malformed request is dropped
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    try:
        pid = os.fork()
    except OSError as exc:
        with suppress(OSError):
            resident.send(conn, {"refused": f"cannot fork: {exc.strerror}"})  # nothing ran: the caller runs it
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    if pid == 0:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        server.wakeup.close()
        server.wakeup_write.close()
        os.close(server.lock_fd)
        conn.close()
        for child in server.children.values():
            child.conn.close()
            os.close(child.pidfd)
        _take(message, fds)
        return message
    for fd in fds:
        os.close(fd)
    with suppress(OSError):
        os.setpgid(pid, pid)  # both sides, so a signal passed on right away finds the group
    server.served += 1
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # out of descriptors: the command cannot be watched, so it does not run
        with suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with suppress(OSError):
            resident.send(conn, {"killed": int(signal.SIGKILL)})
        conn.close()
        return None
    child = Child(pid, conn, pidfd)
    server.children[pid] = child
    conn.settimeout(None)
    with suppress(OSError):
        resident.send(conn, {"started": pid})
    selector.register(conn, selectors.EVENT_READ, child)
    selector.register(child.pidfd, selectors.EVENT_READ, child)
    return None


def _from_caller(selector: selectors.BaseSelector, child: Child) -> None:
    """A signal to pass on, or the caller gone (then the command goes too)."""
    try:
        message, _ = resident.receive(child.conn)
    except (OSError, ValueError):
        message = None
    if message is None:
        signum = signal.SIGKILL
        child.caller_gone = True
        selector.unregister(child.conn)  # a closed connection stays readable: watch only the child's end
    elif int(message.get("signal", 0)) in resident.SIGNALS:
        signum = signal.Signals(int(message["signal"]))
    else:
        return
    with suppress(OSError):
        os.killpg(child.pid, signum)


def _ended(server: Server, selector: selectors.BaseSelector, child: Child) -> None:
    _, status = os.waitpid(child.pid, 0)
    outcome = {"killed": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)}
    if not child.caller_gone:
        with suppress(OSError):
            resident.send(child.conn, outcome)
        selector.unregister(child.conn)
    selector.unregister(child.pidfd)
    child.conn.close()
    os.close(child.pidfd)
    del server.children[child.pid]


def _take(request: dict[str, Any], fds: list[int]) -> None:
    """The command's world, in the child: its streams, directory, environment, umask, limits, signals."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(int(request["umask"]))
    soft, hard = request["limits"]["nofile"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for signum, disposition in request["signals"].items():
        number = signal.Signals(int(signum))
        default = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        signal.signal(number, signal.SIG_IGN if disposition == "ignored" else default)
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = open(0, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    line_buffered = 1 if os.isatty(1) else -1
    sys.stdout = open(1, "w", buffering=line_buffered, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False)  # noqa: SIM115


def _release(server: Server) -> None:
    """Remove the socket (if it is still this server's) and drop the lock."""
    if server.lock_fd < 0:
        return
    with suppress(OSError):
        if os.stat(server.sock_path).st_ino == server.inode:
            os.unlink(server.sock_path)
    os.close(server.lock_fd)
    server.lock_fd = -1


def _exit(server: Server) -> None:
    _release(server)
    os._exit(0)


def _listen(sock_path: str) -> tuple[socket.socket, int]:
    """Take the lock (or say another server holds it), then replace whatever socket file is left."""
    lock = os.open(resident.lock_path(sock_path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise resident.PreloadError("a preloaded process already serves this environment") from None
    with suppress(FileNotFoundError):
        os.unlink(sock_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(sock_path)
        listener.listen(64)
    except OSError as exc:  # a socket path is limited to 107 bytes: a long XDG_RUNTIME_DIR can pass it
        raise resident.PreloadError(f"{sock_path}: cannot listen there: {exc.strerror or exc}") from None
    return listener, lock


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m narwhal_assets.cli.preload_server")
    parser.add_argument("--idle", type=float, required=True, help="seconds without a command before exiting")
    args = parser.parse_args()
    gc.disable()
    for name in PRELOADED:
        importlib.import_module(name)
    importlib.import_module("narwhal_assets.runtime.instance_storage").load_schema_heads()
    gc.freeze()  # the loaded modules are never scanned again, in the server or a child
    gc.enable()
    sock_path = resident.socket_path(os.environ)
    listener, lock_fd = _listen(sock_path)
    wakeup, wakeup_write = socket.socketpair()
    for end in (wakeup, wakeup_write):
        end.setblocking(False)
    server = Server(sock_path, os.stat(sock_path).st_ino, lock_fd, wakeup, wakeup_write, args.idle, fingerprint())
    signal.set_wakeup_fd(wakeup_write.fileno())
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "stopping", True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return serve(server, listener)


if __name__ == "__main__":
    try:
        request = main()
    except resident.PreloadError as exc:
        print(exc, file=sys.stderr)  # the last line `preload start` reports
        raise SystemExit(2) from None
    sys.argv = ["deploy-hosts", *request["run"]]
    from narwhal_assets.cli.main import command

    raise SystemExit(command())

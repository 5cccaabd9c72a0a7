"""Root-only system plumbing for the simulated fleet: commands, accounts, namespaces and processes.

Kept apart from `fleet.py` so the fleet logic reads as "what a host is" and this module as "how Linux is
asked for it". Every command is an argv list; nothing goes through a shell.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

SSHD = "/usr/sbin/sshd"
REQUIRED_TOOLS = ("ip", "unshare", "useradd", "userdel", "chpasswd", "ssh-keygen", "mount")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


class FleetError(RuntimeError):
    """A simulated-fleet operation failed; the message names the command or resource."""


NETWORK_LOCK = Path("/run/lock/narwhal-fleetsim-network.lock")


@contextlib.contextmanager
def network_claim_lock() -> Iterator[None]:
    """Held while a fleet picks its free subnets and routes them, so parallel test workers never pick alike."""
    NETWORK_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NETWORK_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def missing_prerequisites() -> list[str]:
    """Why a fleet cannot be started here (empty when it can): root, sshd and the network tools."""
    missing = [] if os.geteuid() == 0 else ["root privileges (network namespaces, useradd, mount)"]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (Debian package openssh-server)")
    missing += [f"`{tool}` on PATH" for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    return missing


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command, capturing output; on failure raise with its stderr (stdin is never echoed)."""
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise FleetError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def run_retrying_lock(argv: Sequence[str], *, stdin: str | None = None, seconds: float = 20.0) -> None:
    """useradd/userdel/chpasswd fail at once when a parallel fleet holds the passwd lock; retry those."""
    deadline = time.monotonic() + seconds
    while True:
        proc = run(argv, stdin=stdin, check=False)
        if proc.returncode == 0:
            return
        busy = "lock" in proc.stderr.lower() or "currently used by process" in proc.stderr
        if not busy or time.monotonic() > deadline:
            raise FleetError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        time.sleep(0.05 + random.random() * 0.1)


# --- accounts -------------------------------------------------------------------------------------


def add_user(name: str, home: Path, comment: str, *, system: bool = True) -> pwd.struct_passwd:
    """An account with a bash login shell; its home is created by the caller under the workdir.

    A system account unless `system` is false: Debian's system range (101-999) holds fewer than 900 accounts
    for every fleet on the machine, so a large fleet takes regular ones (from UID_MIN), without the
    subordinate ID ranges useradd would otherwise give each.
    """
    kind = ["--system"] if system else ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"]
    run_retrying_lock(
        ["useradd", *kind, "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash",
         "--user-group", "--comment", comment, name]
    )  # fmt: skip
    return pwd.getpwnam(name)


def set_passwords(passwords: dict[str, str | None]) -> None:
    """Set each account's password through chpasswd's stdin, one call for all; None stores `*` (no password,
    yet not a locked account).

    Without PAM, sshd refuses even key logins to an account whose hash starts with `!` (useradd's default).
    """
    for name, password in passwords.items():
        if password is not None and any(c in password for c in "\n\r\0"):
            raise FleetError(f"password for {name}: line breaks and NUL cannot be passed to chpasswd")
    none = "".join(f"{name}:*\n" for name, password in passwords.items() if password is None)
    plain = "".join(f"{name}:{password}\n" for name, password in passwords.items() if password is not None)
    if none:
        run_retrying_lock(["chpasswd", "--encrypted"], stdin=none)
    if plain:
        run_retrying_lock(["chpasswd"], stdin=plain)


def delete_user(name: str) -> None:
    """Remove the account and its group (no-op when already gone)."""
    if user_exists(name):
        run_retrying_lock(["userdel", name])


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# --- namespaces -----------------------------------------------------------------------------------


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_netns(netns: str, action: Callable[[], T]) -> T:
    """`action()` run inside `netns` by a short-lived helper thread, which switches namespace, never this one.

    What it creates keeps the namespace it was made in: a socket stays there, so the caller can connect
    from any thread, and a file under /proc/sys/net opened there is that namespace's setting.
    """
    box: list[T | BaseException] = []

    def switch_and_run() -> None:
        try:
            with open("/proc/thread-self/ns/net", "rb") as own, open(f"/run/netns/{netns}", "rb") as target:
                _setns(target.fileno())
                try:
                    box.append(action())
                finally:
                    _setns(own.fileno())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=switch_and_run, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def netns_socket(netns: str) -> socket.socket:
    """A TCP socket that lives in `netns`."""
    return in_netns(netns, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))


def netns_sysctl(netns: str, path: str, value: str) -> None:
    """Write `value` to /proc/sys/`path` of `netns` (no `ip netns exec sysctl` process per host)."""
    in_netns(netns, lambda: Path("/proc/sys", path).write_text(value + "\n", encoding="ascii"))


def ssh_banner(netns: str, address: str, port: int, timeout: float = 0.5) -> bytes | None:
    """The SSH banner read from inside `netns`, or None while nothing answers yet."""
    sock = netns_socket(netns)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
        banner = sock.recv(64)
    except OSError:
        return None
    finally:
        sock.close()
    return banner if banner.startswith(b"SSH-") else None


def accepts(netns: str, address: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something in `netns` accepts TCP connections on address:port."""
    sock = netns_socket(netns)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
    except OSError:
        return False
    finally:
        sock.close()
    return True


def wait_for_sshd(netns: str, address: str, port: int, alive: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll until sshd in `netns` answers with a banner; fail fast if its process exits."""
    _wait_until(lambda: ssh_banner(netns, address, port) is not None, alive, f"sshd in {netns}", address, port, seconds)


def wait_for_listener(netns: str, address: str, port: int, alive: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll until a relay in `netns` accepts connections (its banner would take the relay's latency to come)."""
    _wait_until(lambda: accepts(netns, address, port), alive, f"the relay in {netns}", address, port, seconds)


def _wait_until(
    ready: Callable[[], bool], alive: Callable[[], bool], what: str, address: str, port: int, seconds: float
) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if not alive():
            raise FleetError(f"{what} exited before accepting connections")
        if time.monotonic() > deadline:
            raise FleetError(f"{what} did not accept connections on {address}:{port} in {seconds}s")
        time.sleep(0.02)


def netns_inode(netns: str) -> int | None:
    """Identity of a named network namespace (None when it does not exist)."""
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except FileNotFoundError:
        return None


# --- processes ------------------------------------------------------------------------------------


def _pids() -> Iterable[int]:
    return (int(entry) for entry in os.listdir("/proc") if entry.isdigit())


def host_processes(net_inodes: set[int], uids: set[int]) -> list[int]:
    """Every process inside one of the namespaces or running as one of the users: a host's whole tree.

    sshd's per-connection children call setsid(), so a process group or session would miss them.
    """
    found = []
    for pid in _pids():
        try:
            in_netns = os.stat(f"/proc/{pid}/ns/net").st_ino in net_inodes
            owned = os.stat(f"/proc/{pid}").st_uid in uids
        except OSError:
            continue
        if (in_netns or owned) and pid != os.getpid() and is_running(pid):
            found.append(pid)
    return found


def is_running(pid: int) -> bool:
    """True unless the process is gone or a zombie (reaped here when it is our own child)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def signal_and_wait(pids: Iterable[int], sig: int = signal.SIGKILL, seconds: float = 10.0) -> list[int]:
    """Send `sig` and wait for the processes to end; returns those still alive at the deadline."""
    pending = list(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        pending = [pid for pid in pending if is_running(pid)]
        if pending:
            time.sleep(0.02)
    return pending


def kill_host_processes(net_inodes: set[int], uids: set[int], seconds: float = 10.0) -> None:
    """SIGKILL whole hosts as a power cut would: every process is frozen first (SIGSTOP, rescanning for
    children forked meanwhile), so none sees another die and cleans up, then all get SIGKILL."""
    deadline = time.monotonic() + seconds
    stopped: set[int] = set()
    while new := [pid for pid in host_processes(net_inodes, uids) if pid not in stopped]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped.update(new)
        if time.monotonic() > deadline:
            raise FleetError(f"processes kept forking while being stopped: {sorted(new)}")
    while pids := host_processes(net_inodes, uids):
        left = signal_and_wait(pids, signal.SIGKILL, max(0.1, deadline - time.monotonic()))
        if time.monotonic() > deadline:
            raise FleetError(f"processes survived SIGKILL: {sorted(left or pids)}")

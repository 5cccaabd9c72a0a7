"""What one command and every process it starts spend on the workstation, for the fleet benchmarks.

The command runs in a cgroup of its own (cgroup v2, or v1's cpuacct where v2 is not mounted), joined
before it starts, so its CPU counts every descendant, reaped or not, daemonised or not: a fork server's
workers included. While it runs, /proc is sampled for the cgroup's processes: their memory (the sum of
PSS, so a forked child's shared pages count once), threads, file descriptors and SSH sessions (TCP
connections in state ESTABLISHED to port 22 whose socket one of them holds). Peaks are the largest sample
(every `interval` seconds, so a spike shorter than that can be missed); `max_rss` is the kernel's own peak
of the largest single process (wait4). Needs root (cgroups, other users' /proc entries).

Also here: `quiesce`, which waits until the machine's CPUs are idle again before a measurement, and
`lowest_cpu_share`, which puts the simulated hosts behind the workstation on the shared CPUs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TCP_ESTABLISHED = "01"
SSH_PORT = 22
QUIESCE_S = 20.0
_serial = itertools.count()


@dataclass
class Usage:
    """One command's run: wall and CPU seconds, peaks over its process tree, exit status and output."""

    wall: float
    cpu: float
    returncode: int
    stdout: str
    stderr: str
    max_rss: int = 0  # bytes: the largest single process's peak resident set (wait4)
    peak_pss: int = 0  # bytes: the largest sampled sum of PSS over the tree
    peak_sessions: int = 0
    peak_threads: int = 0
    peak_fds: int = 0
    peak_processes: int = 0
    samples: int = 0
    leftover: list[int] = field(default_factory=list)  # processes still in the cgroup after it exited


class Cgroup:
    """A fresh cgroup that reports CPU seconds of everything ever in it (v2 cpu.stat or v1 cpuacct.usage)."""

    def __init__(self, under: Path | None = None) -> None:
        """A new group in the accounting hierarchy, or under `under` (another hierarchy's directory)."""
        name = f"narwhal-bench-{os.getpid()}-{next(_serial)}"
        v2, v1 = _cgroup2_root(), Path("/sys/fs/cgroup/cpuacct")
        if under is not None:
            self.path, self.v2 = under / name, under == v2
        elif v2 is not None:
            self.path, self.v2 = v2 / name, True
        elif (v1 / "cpuacct.usage").is_file():
            self.path, self.v2 = v1 / name, False
        else:
            raise SystemExit("process_meter: needs root and a cgroup2 or cgroup v1 cpuacct hierarchy")
        self.path.mkdir()

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def joining(self, argv: Sequence[str]) -> list[str]:
        """`argv` behind a shell that joins this cgroup and then becomes the command: none of it runs outside."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.procs_file), *argv]

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(line) for line in self.procs_file.read_text().split()]
        return []

    def cpu_seconds(self) -> float:
        if self.v2:
            stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def drain(self, wait_s: float = 10.0) -> list[int]:
        """Wait until the cgroup is empty; processes still there after `wait_s` are killed (and returned)."""
        deadline = time.monotonic() + wait_s
        while (left := self.pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.pids() and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        return left

    def release(self) -> None:
        """Every process still in the group back to its parent group (one that exited meanwhile is skipped)."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                (self.path.parent / "cgroup.procs").write_text(f"{pid}\n")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def lowest_cpu_share(pids: Sequence[int]) -> Iterator[str]:
    """`pids` and everything they fork at the scheduler's lowest CPU share while the body runs; yields what
    was applied, for the report.

    A real fleet's hosts run on their own CPUs; simulated ones share the workstation's, so their probes and
    sessions stretch every command's wall, and a command's CPU grows with its wall (an open connection
    costs CPU while it waits). At the lowest share the workstation's command runs whenever it can, the
    closest this machine comes to hosts of their own. cgroup v1's `cpu` hierarchy (`cpu.shares` 2), or
    v2's `cpu.weight` 1 where its cpu controller can be enabled (there a process has one group: this takes
    the hosts out of any v2 group that counts them); neither, and the hosts keep the default.
    """
    v1, v2 = Path("/sys/fs/cgroup/cpu"), _cgroup2_root()
    if (v1 / "cpu.shares").is_file():
        under, (knob, value) = v1, ("cpu.shares", "2")
    elif v2 is not None and "cpu" in (v2 / "cgroup.controllers").read_text().split():
        with contextlib.suppress(OSError):  # already on, or refused: the knob's write below says which
            (v2 / "cgroup.subtree_control").write_text("+cpu\n")
        under, (knob, value) = v2, ("cpu.weight", "1")
    else:
        yield "the default CPU share (no cgroup cpu controller to lower it)"
        return
    group, applied, step = None, f"the lowest CPU share ({knob} {value})", f"a group under {under}"
    try:
        group = Cgroup(under)
        step = str(group.path / knob)
        (group.path / knob).write_text(f"{value}\n")
        for pid in pids:
            step = f"{group.procs_file} (pid {pid})"
            group.procs_file.write_text(f"{pid}\n")
    except OSError as exc:
        applied = f"the default CPU share (could not lower it: {step}: {exc.strerror})"
        if group is not None:
            group.release()
    try:
        yield applied
    finally:
        if group is not None:
            group.release()
            group.remove()


def _cgroup2_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


def run_measured(
    argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, interval: float = 0.05,
    timeout: float = 3600.0,
) -> Usage:  # fmt: skip
    """Run `argv` in a new cgroup and measure it (see the module docstring); output is captured to files."""
    group = Cgroup()
    stop = threading.Event()
    peaks = _Peaks()
    sampler = threading.Thread(target=_sample, args=(group, stop, interval, peaks), daemon=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        began = time.perf_counter()
        proc = subprocess.Popen(group.joining(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        sampler.start()
        try:
            status, rusage = _wait4(proc, timeout)
            wall = time.perf_counter() - began
        finally:
            stop.set()
            sampler.join()
            leftover = group.drain()
            cpu = group.cpu_seconds()
            group.remove()
        out.seek(0)
        err.seek(0)
        usage = Usage(wall=wall, cpu=cpu, returncode=os.waitstatus_to_exitcode(status),
                      stdout=out.read().decode(errors="replace"), stderr=err.read().decode(errors="replace"),
                      max_rss=rusage.ru_maxrss * 1024, leftover=leftover)  # fmt: skip
    usage.peak_pss, usage.peak_sessions, usage.peak_threads = peaks.pss, peaks.sessions, peaks.threads
    usage.peak_fds, usage.peak_processes, usage.samples = peaks.fds, peaks.processes, peaks.samples
    return usage


@contextlib.contextmanager
def started(argv: Sequence[str], *, log: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[tuple[subprocess.Popen[bytes], Cgroup]]:  # fmt: skip
    """A long-running `argv` (output to `log`) in a new cgroup, for the caller to read its CPU while it runs;
    on leaving, SIGINT (SIGKILL 30 s later), then everything left in the cgroup is killed and it is removed."""
    group = Cgroup()
    with log.open("ab") as out:
        proc = subprocess.Popen(group.joining(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield proc, group
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        group.drain(wait_s=5)
        group.remove()


def _wait4(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, resource.struct_rusage]:
    deadline = time.monotonic() + timeout
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, rusage
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.01)


@dataclass
class _Peaks:
    pss: int = 0
    sessions: int = 0
    threads: int = 0
    fds: int = 0
    processes: int = 0
    samples: int = 0


def _sample(group: Cgroup, stop: threading.Event, interval: float, peaks: _Peaks) -> None:
    while not stop.wait(interval):
        pids = group.pids()
        pss = threads = fds = 0
        sockets: set[str] = set()
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                pss += _pss(pid)
                threads += _threads(pid)
                names = os.listdir(f"/proc/{pid}/fd")
                fds += len(names)
                for name in names:
                    with contextlib.suppress(OSError):
                        target = os.readlink(f"/proc/{pid}/fd/{name}")
                        if target.startswith("socket:["):
                            sockets.add(target[8:-1])
        sessions = _ssh_sessions(pids[0], sockets) if pids and sockets else 0
        peaks.pss, peaks.threads, peaks.fds = max(peaks.pss, pss), max(peaks.threads, threads), max(peaks.fds, fds)
        peaks.sessions, peaks.processes = max(peaks.sessions, sessions), max(peaks.processes, len(pids))
        peaks.samples += 1


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _ssh_sessions(pid: int, inodes: set[str]) -> int:
    """TCP connections to port 22, established, whose socket inode is one of `inodes` (the process's netns)."""
    count = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_ESTABLISHED and int(fields[2].split(":")[1], 16) == SSH_PORT and fields[9] in inodes:
                count += 1
    return count


def quiesce(idle: float = 0.9, most_s: float = QUIESCE_S) -> None:
    """Wait (at most `most_s`) until the CPUs were at least `idle` idle over a short sample: the hosts' own
    background work and other users' load inflate a command's CPU time (never deflate it)."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        first = _cpu_times()
        time.sleep(0.5)
        second = _cpu_times()
        total = sum(second) - sum(first)
        if total <= 0 or (second[3] + second[4] - first[3] - first[4]) / total >= idle:
            return


def _cpu_times() -> list[int]:
    return [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]

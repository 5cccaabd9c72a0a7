"""Discovery probe: runs on a fleet host in the transport's guard (`guard.py`, `-`: source on stdin, `-I -S`) and
prints one JSON document.

Standard library only, Python 3.8+, ASCII source: hosts do not have this package. The workstation appends
`main('<json params>')` (`narwhal_assets.protocols.probe.probe_script`) and parses the document with
`narwhal_assets.protocols.probe_report`. Tool output comes back raw so that parsing lives, and is tested, on the
workstation; the probe does only what must happen on the host: run tools, read sysfs, and hash
checkpoints, so that no checkpoint byte crosses the wire. It never dies with a traceback: every failure
becomes an entry of `errors` and the other facts are still collected.

The module imports cleanly as `narwhal_assets.host.probe` so its hashing can be tested and benchmarked
locally.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import json
import operator
import os
import selectors
import stat
import struct
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` on every host at every discovery

PROBE_SCHEMA = "narwhal.probe"
PROBE_SCHEMA_VERSION = 1
LOG_LIMIT = 64 * 1024
OUTPUT_LIMIT = 16 * 1024 * 1024
READ_CHUNK = 4 * 1024 * 1024
BATCH_FILES = 256  # files per worker task: large enough that per-task costs vanish, small enough to balance
LARGE_FILE = 16 * 1024 * 1024  # larger files are hashed one per task, largest first
STAT_FILES_PER_THREAD = 1024  # per thread of the stat pass: starting one costs about as much as a few dozen stats
STAT_SAMPLE = 256  # files the stat pass times alone before it decides on threads
# Mean stat time above which the rest of the stat pass runs in threads: a network or cold filesystem, where
# stat waits. On a warm local one a stat takes about 1 us and threads only add GIL hand-offs (measured 1.5x
# slower on 20,000 files with 2 threads).
SLOW_STAT_S = 20e-6
DEFAULT_WORKERS_MAX = 32  # beyond this many cores the disk, not SHA-256, is the limit; each worker holds a buffer
COMMAND_TIMEOUT_S = 60.0
NVIDIA_SMI_ARGV = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total,pci.bus_id",
    "--format=csv,noheader,nounits",
]
IP_ARGV = ["ip", "-json", "address"]
HOST_FILES = {
    "machine_id": ["/etc/machine-id"],
    "boot_id": ["/proc/sys/kernel/random/boot_id"],
    "os_release": ["/etc/os-release", "/usr/lib/os-release"],
}
SYSFS_NET = "/sys/class/net"
SYSFS_INFINIBAND = "/sys/class/infiniband"
DEV_INFINIBAND = "/dev/infiniband"  # verbs (uverbs<N>) and rdma_cm character devices an RDMA container needs
DEV_ENTRIES_LIMIT = 256
# Run inside the engine image (`docker run --rm --pull never --network none --entrypoint python3 IMAGE -c ...`):
# the versions of the packages the serving fleet's launcher pins, from the image's installed metadata.
PACKAGES = ("vllm", "nixl", "nixl-rocm", "torch")
PACKAGES_PROGRAM = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "wanted = set(sys.argv[1:])\n"
    "found = {}\n"
    "for dist in metadata.distributions():\n"
    "    name = (dist.metadata['Name'] or '').lower().replace('_', '-').replace('.', '-')\n"
    "    if name in wanted:\n"
    "        found[name] = dist.version\n"
    "print(json.dumps(found, sort_keys=True))\n"
)
CONFIG_FILE = "config.json"
# Hugging Face hub download metadata (`.cache/huggingface/` at the top of a model directory) records when and
# how a replica was fetched, not what it serves: outside the tree digest, as the serving fleet's own.
EXCLUDED_PATH = ".cache/huggingface"
CONFIG_LIMIT = 4 << 20

if TYPE_CHECKING:  # annotations only: hosts may run Python 3.8
    from typing import Any

    Stat = tuple[int, int, int]  # size, mtime_ns, inode
    Row = list[int | str]  # size, mtime_ns, inode, sha256: one file, as sent back and forth


class TreeError(Exception):
    """A checkpoint file that cannot be described by the tree digest; the message names its path."""


# ---------------------------------------------------------------- commands and files


def _text(data: bytes | None, limit: int) -> str:
    """Decode tool output for JSON; invalid UTF-8 is replaced rather than fatal."""
    raw = data or b""
    text = raw[:limit].decode("utf-8", errors="replace")
    if len(raw) > limit:
        text += f"\n[... {len(raw) - limit} bytes truncated by the probe]\n"
    return text


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} characters truncated in the log]\n"


def _command_env() -> dict[str, str]:
    """The caller's environment with the C locale, so tool messages are stable for the parser."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def _execute(argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run argv without a shell; a missing tool reads as exit 127 like a shell would report it."""
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=_command_env(), check=False
        )
    except FileNotFoundError:
        return 127, b"", f"{argv[0]}: command not found\n".encode()
    except PermissionError as exc:
        return 126, b"", f"{argv[0]}: {exc.strerror}\n".encode()
    except subprocess.TimeoutExpired as exc:
        note = f"{argv[0]}: timed out after {timeout:.0f} s\n".encode()
        return 124, exc.stdout or b"", (exc.stderr or b"") + note
    except OSError as exc:
        return 126, b"", f"{argv[0]}: {exc.strerror or exc}\n".encode()
    return proc.returncode, proc.stdout, proc.stderr


def _read_limited(path: str, limit: int) -> bytes:
    """Read in small chunks: procfs sysctl files fail with ENOMEM when asked for megabytes at once."""
    chunks = []
    total = 0
    with open(path, "rb") as handle:
        while total < limit:
            chunk = handle.read(64 * 1024)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    return b"".join(chunks)


def read_text(paths: list[str]) -> dict[str, Any]:
    """The first readable file of `paths` as {path, text, error}; the parser judges what is missing."""
    error = None
    for path in paths:
        try:
            return {"path": path, "text": _text(_read_limited(path, LOG_LIMIT), LOG_LIMIT), "error": None}
        except OSError as exc:
            error = exc.strerror or str(exc)
    return {"path": paths[0], "text": None, "error": error}


class Probe:
    """Collects facts, the full result of each tool, a truncated command log, and structured errors."""

    def __init__(self) -> None:
        self.tools: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []
        self.errors: list[dict[str, str]] = []

    def run(self, tool: str, argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        """Run one command, keep its full output under `tool` and a clipped copy in the log."""
        started = time.monotonic()
        rc, out, err = _execute(argv, timeout)
        entry: dict[str, Any] = {
            "argv": list(argv),
            "rc": rc,
            "stdout": _text(out, OUTPUT_LIMIT),
            "stderr": _text(err, OUTPUT_LIMIT),
            "seconds": round(time.monotonic() - started, 3),
        }
        self.tools[tool] = entry
        self.log.append(dict(entry, stdout=_clip(entry["stdout"], LOG_LIMIT), stderr=_clip(entry["stderr"], LOG_LIMIT)))
        return entry

    def error(self, tool: str, message: str) -> None:
        self.errors.append({"tool": tool, "message": message})

    def guard(self, tool: str, collect: Any, *args: Any) -> Any:
        """Call one collector; an unexpected exception becomes an error entry, not a traceback."""
        try:
            return collect(*args)
        except Exception as exc:
            self.error(tool, f"internal error: {type(exc).__name__}: {exc}")
            return None


# ---------------------------------------------------------------- network and RDMA


def _read_stripped(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return None


def link_speed(sysfs_net: str, name: str) -> int | None:
    """Mbit/s from sysfs; None when the file is missing, unreadable (EINVAL when down) or -1."""
    text = _read_stripped(os.path.join(sysfs_net, name, "speed"))
    try:
        speed = int(text or "")
    except ValueError:
        return None
    return speed if speed > 0 else None


def link_speeds(sysfs_net: str) -> dict[str, int | None]:
    """Speeds of every interface the kernel lists; `ip` output is parsed on the workstation."""
    if not os.path.isdir(sysfs_net):
        return {}
    return {name: link_speed(sysfs_net, name) for name in sorted(os.listdir(sysfs_net))}


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _port_key(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)


def rdma_ports(root: str) -> list[dict[str, Any]]:
    """Every port under `<root>/<device>/ports/<n>` with its raw state, link layer, rate, netdevs and the
    HCA's verbs devices (`<device>/device/infiniband_verbs/uverbs<N>`, named like their /dev nodes)."""
    ports = []
    for device in _listdir(root):
        netdevs = _listdir(os.path.join(root, device, "device", "net"))
        verbs = [name for name in _listdir(os.path.join(root, device, "device", "infiniband_verbs"))
                 if name.startswith("uverbs")]  # fmt: skip
        ports_dir = os.path.join(root, device, "ports")
        for port in sorted(_listdir(ports_dir), key=_port_key):
            base = os.path.join(ports_dir, port)
            ports.append(
                {
                    "device": device,
                    "port": port,
                    "state": _read_stripped(os.path.join(base, "state")),
                    "link_layer": _read_stripped(os.path.join(base, "link_layer")),
                    "rate": _read_stripped(os.path.join(base, "rate")),
                    "netdevs": netdevs,
                    "verbs": verbs,
                }
            )
    return ports


def character_devices(root: str) -> list[str]:
    """Names of the character devices directly under `root` (lstat: a symlink is not a device node)."""
    names = []
    for name in _listdir(root)[:DEV_ENTRIES_LIMIT]:
        try:
            if stat.S_ISCHR(os.lstat(os.path.join(root, name)).st_mode):
                names.append(name)
        except OSError:
            continue
    return names


def image_packages(probe: Probe, params: dict[str, Any]) -> dict[str, str] | None:
    """Inspect the engine image; list its pinned packages by running it, unless the workstation already
    knows them for exactly this (immutable) image id. Returns the known versions when they were reused."""
    inspected = probe.run("docker", ["docker", "image", "inspect", params["image"]])
    try:
        image_id = json.loads(inspected["stdout"])[0]["Id"] if inspected["rc"] == 0 else None
    except (ValueError, LookupError, TypeError):
        image_id = None
    if not isinstance(image_id, str) or image_id.startswith("-"):
        return None  # the inspect result tells the workstation why
    known = params["known_packages"].get(image_id)
    if isinstance(known, dict):
        return known
    argv = ["docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3", image_id,
            "-c", PACKAGES_PROGRAM, *PACKAGES]  # fmt: skip
    probe.run("docker-packages", argv)
    return None


# ---------------------------------------------------------------- checkpoint trees


def _check_names(directory: str, names: list[str]) -> None:
    """Reject names the sha256sum line format cannot carry verbatim (it escapes them); one pass per directory."""
    joined = "/".join(names)
    if "\n" in joined or "\\" in joined:
        bad = next(name for name in names if "\n" in name or "\\" in name)
        raise TreeError(f"{os.path.join(directory, bad)}: file name contains a newline or backslash")
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        bad = next(name for name in names if not _encodes(name))
        raise TreeError(f"{os.path.join(directory, bad)}: file name is not valid UTF-8") from None


def _encodes(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _classify_link(path: str) -> None:
    """Follow a symlink the way `find -L` does; only a link to a regular file is allowed."""
    try:
        target = os.stat(path)
    except FileNotFoundError:
        raise TreeError(f"{path}: dangling symlink") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TreeError(f"{path}: symlink loop") from None
        raise TreeError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(target.st_mode):
        raise TreeError(f"{path}: symlink to a directory (not allowed in a checkpoint)")
    if not stat.S_ISREG(target.st_mode):
        raise TreeError(f"{path}: symlink to a fifo, socket or device")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """True for a directory, False for a link to a regular file; TreeError for anything else."""
    if entry.is_symlink():
        _classify_link(entry.path)
        return False
    if entry.is_dir(follow_symlinks=False):
        return True
    raise TreeError(f"{entry.path}: not a regular file (fifo, socket or device)")


def scan_tree(root: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(relative POSIX path, absolute path) of every file under root, plus every problem.

    Names and entry types come from the directory listing alone (no stat per file: the workers take it
    in parallel). Every name counts, dot-files included, except the hub metadata under EXCLUDED_PATH.
    """
    files: list[tuple[str, str]] = []
    problems: list[str] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        directory = os.path.join(root, rel_dir) if rel_dir else root
        prefix = rel_dir + "/" if rel_dir else ""
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
            _check_names(directory, [entry.name for entry in listed])
        except TreeError as exc:
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror or exc}")
            continue
        for entry in listed:
            if prefix + entry.name == EXCLUDED_PATH:
                continue
            try:
                if not rel_dir and entry.name == "-":
                    raise TreeError(f"{entry.path}: a top-level file named '-' is read as stdin by sha256sum")
                if entry.is_file(follow_symlinks=False) or not _is_dir(entry):  # the file type needs no stat
                    files.append((prefix + entry.name, entry.path))
                else:
                    pending.append(prefix + entry.name)
            except TreeError as exc:
                problems.append(str(exc))
            except OSError as exc:
                problems.append(f"{entry.path}: {exc.strerror or exc}")
    return files, problems


def digest_stream(fd: int, buffer: bytearray, size: int) -> tuple[str, int]:
    """SHA-256 and byte count of the first `size` bytes (more if the file grew) of fd, through one buffer.

    Reading stops at `size` bytes or end of file: the caller's fstat afterwards catches any growth, so a
    small file costs one read call.
    """
    digest = hashlib.sha256()
    view = memoryview(buffer)
    total = 0
    while total < size:
        count = os.readv(fd, [buffer])
        if not count:
            break
        digest.update(view[:count])
        total += count
    return digest.hexdigest(), total


def _digest_open(fd: int, path: str, before: Stat, buffer: bytearray) -> Row:
    """Hash an open file whose stat before reading was `before`; refuse it if size, mtime or inode moved."""
    if before[0] > len(buffer) and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    sha256, count = digest_stream(fd, buffer, before[0])
    after = os.fstat(fd)
    if (after.st_size, after.st_mtime_ns, after.st_ino) != before or count != before[0]:
        raise TreeError(f"{path}: changed while being read")
    return [before[0], before[1], before[2], sha256]


def _reusable(row: Any, info: os.stat_result) -> bool:
    """Whether a previous row `[size, mtime_ns, inode, sha256]` still describes the file `info` stats."""
    return (
        row.__class__ is list and len(row) == 4 and row[0] == info.st_size and row[1] == info.st_mtime_ns
        and row[2] == info.st_ino and row[3].__class__ is str
    )  # fmt: skip


def examine(path: str, previous: Any, buffer: bytearray, defer_above: int) -> Row | Stat | None:
    """One file's fate: None when its `previous` row still holds (same size, mtime_ns, inode), its stat
    when it is larger than `defer_above` (hashed later, largest first), else its freshly hashed row.
    """
    if previous is not None:
        info = os.stat(path)
        if _reusable(previous, info):
            return None
        before = (info.st_size, info.st_mtime_ns, info.st_ino)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        if previous is None:
            info = os.fstat(fd)
            before = (info.st_size, info.st_mtime_ns, info.st_ino)
        if before[0] > defer_above:
            return before
        return _digest_open(fd, path, before, buffer)
    finally:
        os.close(fd)


def examine_range(
    files: list[tuple[str, str]], previous: Any, buffer: bytearray, span: tuple[int, int], defer_above: int
) -> tuple[list[list[Any]], list[tuple[int, int]]]:
    """`examine` files[start:end]. Items for the files that were not reused, [index, problem] or
    [index, size, mtime_ns, inode, sha256], and (size, index) of the files deferred as large."""
    items: list[list[Any]] = []
    deferred: list[tuple[int, int]] = []
    for index in range(*span):
        rel, path = files[index]
        try:
            outcome = examine(path, None if previous is None else previous.get(rel, False), buffer, defer_above)
        except TreeError as exc:
            items.append([index, str(exc)])
            continue
        except OSError as exc:
            items.append([index, f"{path}: {exc.strerror or exc}"])
            continue
        if outcome is None:
            continue
        if isinstance(outcome, tuple):  # a Stat: hashed later
            deferred.append((outcome[0], index))
        else:
            items.append([index, *outcome])
    return items, deferred


TASK = struct.Struct("<III")  # kind (0: examine a range, deferring large files; 1: hash one file), start, end


def _serve(files: list[tuple[str, str]], task_fd: int, result_fd: int) -> None:
    """Worker process loop: read a task, answer one JSON line `[kind, start, items, deferred]`; stop at EOF."""
    buffer = bytearray(READ_CHUNK)
    while True:
        raw = b""
        while len(raw) < TASK.size:
            part = os.read(task_fd, TASK.size - len(raw))
            if not part:
                return
            raw += part
        kind, start, end = TASK.unpack(raw)
        defer_above = LARGE_FILE if kind == 0 else 1 << 62
        items, deferred = examine_range(files, None, buffer, (start, end), defer_above)
        _write_all(result_fd, json.dumps([kind, start, items, deferred]).encode() + b"\n")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Worker:
    """One forked hashing process and the parent's ends of its task and result pipes."""

    def __init__(self, files: list[tuple[str, str]], inherited: list[int]) -> None:
        task_r, self.task_fd = os.pipe()
        self.result_fd, result_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the child, whose coverage is not collected
            code = 1
            try:
                for fd in (self.task_fd, self.result_fd, *inherited):
                    os.close(fd)
                quiet = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # never hold the SSH channel open after the probe itself has ended
                    os.dup2(quiet, fd)
                _serve(files, task_r, result_w)
                code = 0
            finally:
                os._exit(code)
        os.close(task_r)
        os.close(result_w)
        self.pending: list[tuple[int, int, int]] = []
        self.received = b""

    def send(self, task: tuple[int, int, int]) -> None:
        """Queue one task; if the worker has died it counts as pending, to be reported as not hashed."""
        self.pending.append(task)
        try:
            _write_all(self.task_fd, TASK.pack(*task))
        except BrokenPipeError:
            self.close_tasks()

    def close_tasks(self) -> None:
        """No more tasks: the worker exits once it has answered those it has."""
        if self.task_fd >= 0:
            os.close(self.task_fd)
            self.task_fd = -1

    def answers(self, data: bytes) -> list[tuple[tuple[int, int, int], list[list[Any]], list[list[int]]]]:
        self.received += data
        *lines, self.received = self.received.split(b"\n")
        done = []
        for line in lines:
            kind, start, items, deferred = json.loads(line)
            task = next(t for t in self.pending if t[:2] == (kind, start))
            self.pending.remove(task)
            done.append((task, items, deferred))
        return done

    def finish(self) -> int:
        """Close both pipes and reap the process; its wait status (0 when it ended normally)."""
        self.close_tasks()
        os.close(self.result_fd)
        return os.waitpid(self.pid, 0)[1]


class _Scheduler:
    """Hands tasks to workers, two in flight each: deferred large files first (largest first), then ranges."""

    def __init__(self, count: int, workers: int, deferred: list[tuple[int, int]]) -> None:
        """Ranges cover all `count` files unless (size, index) `deferred` files are given: then only those."""
        step = max(1, min(BATCH_FILES, -(-count // (4 * workers))))
        self.ranges = [] if deferred else [(0, start, min(start + step, count)) for start in range(0, count, step)]
        self.ranges.reverse()
        self.large = [(-size, index) for size, index in deferred]  # a heap: largest first
        heapq.heapify(self.large)
        self.ranges_out = 0
        self.items: list[list[Any]] = []
        self.lost: list[tuple[int, int, int]] = []

    def next_task(self) -> tuple[int, int, int] | None:
        if self.large:
            index = heapq.heappop(self.large)[1]
            return (1, index, index + 1)
        if self.ranges:
            self.ranges_out += 1
            return self.ranges.pop()
        return None

    def done(self, task: tuple[int, int, int], items: list[list[Any]], deferred: list[list[int]]) -> None:
        self.items += items
        for size, index in deferred:
            heapq.heappush(self.large, (-size, index))
        if task[0] == 0:
            self.ranges_out -= 1

    @property
    def finished(self) -> bool:
        return not self.large and not self.ranges and self.ranges_out == 0


def _examine_in_workers(files: list[tuple[str, str]], workers: int, deferred: list[tuple[int, int]]) -> list[list[Any]]:
    """Hash every file (or only the (size, index) `deferred` ones) in forked worker processes; their items.

    Processes, not threads: for small files the per-file Python work holds the GIL, so threads only help
    large shards. Forking shares `files` with the children; only small task records and the results
    move through pipes. Large files are deferred by the first pass and then handed out one per task,
    largest first, so no worker ends long after the others.
    """
    plan = _Scheduler(len(files), workers, deferred)
    pool: list[_Worker] = []
    for _ in range(min(workers, len(deferred) or len(files))):
        pool.append(_Worker(files, [fd for w in pool for fd in (w.task_fd, w.result_fd)]))
    with selectors.DefaultSelector() as selector:
        for worker in pool:
            selector.register(worker.result_fd, selectors.EVENT_READ, worker)
        while selector.get_map():
            for worker in pool:
                while worker.task_fd >= 0 and len(worker.pending) < 2:
                    task = plan.next_task()
                    if task is None:
                        break
                    worker.send(task)
                if plan.finished:
                    worker.close_tasks()
            for key, _ in selector.select():
                worker = key.data
                data = os.read(worker.result_fd, 1 << 20)
                if not data:
                    selector.unregister(worker.result_fd)
                    worker.close_tasks()
                    plan.lost += worker.pending
                    plan.ranges_out -= sum(task[0] == 0 for task in worker.pending)
                    worker.pending = []
                for answer in worker.answers(data) if data else []:
                    plan.done(*answer)
    statuses = [worker.finish() for worker in pool]
    failure = next((f"hashing process exited with wait status {s}" for s in statuses if s), "no hashing process left")
    lost = [*plan.lost, *[(1, index, index + 1) for _, index in plan.large], *plan.ranges]
    for _, start, end in lost:
        plan.items += [[index, f"{files[index][1]}: not hashed ({failure})"] for index in range(start, end)]
    return plan.items


def stat_range(
    files: list[tuple[str, str]], previous: Any, span: tuple[int, int]
) -> tuple[list[list[Any]], list[tuple[int, int]]]:
    """The stat pass over files[start:end], reading none: [index, problem] items, and (size, index) of every
    file whose `previous` row (None: no rows) does not hold. One stat per file and nothing else: on an
    unchanged tree this loop is the whole cost of the probe's checkpoint work."""
    items: list[list[Any]] = []
    deferred: list[tuple[int, int]] = []
    row_of = previous.get if previous is not None else {}.get
    for index in range(*span):
        rel, path = files[index]
        try:
            info = os.stat(path)
        except OSError as exc:
            items.append([index, f"{path}: {exc.strerror or exc}"])
            continue
        if not _reusable(row_of(rel), info):
            deferred.append((info.st_size, index))
    return items, deferred


def _stat_pass(
    files: list[tuple[str, str]], previous: Any, workers: int
) -> tuple[list[list[Any]], list[tuple[int, int]]]:
    """`stat_range` over all files: the first STAT_SAMPLE alone, timed; the rest in threads only when those
    stats were slow (stat releases the GIL while it waits; processes would add a fork and copied pages)."""
    count = len(files)
    started = time.perf_counter()
    sampled = min(count, STAT_SAMPLE)
    items, deferred = stat_range(files, previous, (0, sampled))
    slow = time.perf_counter() - started > SLOW_STAT_S * sampled
    threads = min(workers, (count - sampled) // STAT_FILES_PER_THREAD) if slow else 1
    if threads < 2:
        rest_items, rest_deferred = stat_range(files, previous, (sampled, count))
        return items + rest_items, deferred + rest_deferred
    step = -(-(count - sampled) // threads)
    spans = [(start, min(count, start + step)) for start in range(sampled, count, step)]
    parts: list[Any] = [None] * len(spans)

    def run(number: int) -> None:
        try:
            parts[number] = stat_range(files, previous, spans[number])
        except BaseException as exc:  # raised again below, in the probe's thread (never printed by threading)
            parts[number] = exc

    pool = [threading.Thread(target=run, args=(number,)) for number in range(len(spans))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    failed = next((part for part in parts if isinstance(part, BaseException)), None)
    if failed is not None:
        raise failed
    return items + [item for part in parts for item in part[0]], deferred + [d for part in parts for d in part[1]]


def hash_files(files: list[tuple[str, str]], previous: Any, workers: int) -> list[list[Any]]:
    """Items (see `examine_range`) for every file not reused from `previous` (None: hash everything).

    With `previous`, or for a tree of few files (typically large shards), this process first stats every
    file (`_stat_pass`) and worker processes start only for the files that must be read: an unchanged
    tree costs one stat per file and no fork. Many changed files are hashed in ranges like a tree of
    their own.
    """
    buffer = bytearray(READ_CHUNK)
    if workers == 1 or len(files) < 2:
        return examine_range(files, previous, buffer, (0, len(files)), 1 << 62)[0]
    if previous is None and len(files) > BATCH_FILES:
        return _examine_in_workers(files, workers, [])
    items, deferred = _stat_pass(files, previous, workers)
    if len(deferred) > BATCH_FILES:
        chosen = [index for _, index in deferred]
        for item in _examine_in_workers([files[index] for index in chosen], workers, []):
            items.append([chosen[item[0]], *item[1:]])
        return items
    if len(deferred) > 1:
        return items + _examine_in_workers(files, workers, deferred)
    for _, index in deferred:
        items += examine_range(files, None, buffer, (index, index + 1), 1 << 62)[0]
    return items


def read_config(root: str, expected_sha256: str) -> tuple[str | None, list[str]]:
    """The model's config.json text (for launch limits), only if it is still the bytes that were hashed."""
    path = os.path.join(root, CONFIG_FILE)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(CONFIG_LIMIT + 1)
    except OSError as exc:
        return None, [f"{path}: cannot read ({exc.strerror})"]
    if len(raw) > CONFIG_LIMIT:
        return None, [f"{path}: larger than {CONFIG_LIMIT} bytes"]
    if hashlib.sha256(raw).hexdigest() != expected_sha256:
        return None, [f"{path}: changed while being read"]
    return raw.decode("utf-8", "replace"), []


def hash_tree(
    root: str, previous: dict[str, Any] | None = None, full: bool = False, workers: int | None = None
) -> dict[str, Any]:
    """Per-file hashes of a checkpoint directory, reusing `previous` rows of files whose stat is unchanged.

    `previous` maps relative path -> [size, mtime_ns, inode, sha256]. Returns files (sorted by UTF-8 path
    bytes, each with path, size, mtime_ns, inode, sha256), unchanged, config_sha256, bytes_hashed,
    bytes_reused, files_reused, seconds and problems (each naming a path). `unchanged` is true when the tree
    is exactly `previous` (every file reused, none added or removed): then `files` is empty, since the
    caller already holds those rows, and no per-file record is built or sent. Nothing is read when the
    scan already found a problem: the tree could not be trusted anyway.
    """
    started = time.monotonic()
    result: dict[str, Any] = {"files": [], "unchanged": False, "config_sha256": None, "bytes_hashed": 0}
    result.update(bytes_reused=0, files_reused=0)
    if not os.path.isdir(root):
        reason = "not a directory" if os.path.exists(root) else "no such directory"
        result["problems"] = [f"{root}: {reason}"]
        return dict(result, seconds=round(time.monotonic() - started, 3))
    found, problems = scan_tree(root)
    if not problems:
        reusable = None if full or not previous else previous
        items = hash_files(found, reusable, workers or min(os.cpu_count() or 1, DEFAULT_WORKERS_MAX))
        if reusable is not None and not items and len(found) == len(reusable):
            config = _unchanged(result, reusable)
        else:
            config = _tabulate(result, found, reusable, items, problems)
        result["config_sha256"] = config
        if config is None and not problems:
            problems = [f"{os.path.join(root, CONFIG_FILE)}: missing (the model configuration must be at the top)"]
        elif not problems:
            assert config is not None  # None with no problem is the branch above
            result["config_text"], problems = read_config(root, config)
    return dict(result, problems=sorted(problems), seconds=round(time.monotonic() - started, 3))


def _unchanged(result: dict[str, Any], reusable: dict[str, Any]) -> str | None:
    """Fill the counters of a tree that is exactly `reusable`; its config.json hash."""
    result.update(unchanged=True, files_reused=len(reusable), bytes_reused=sum(row[0] for row in reusable.values()))
    row = reusable.get(CONFIG_FILE)
    return row[3] if row is not None else None


def _tabulate(
    result: dict[str, Any], found: list[tuple[str, str]], reusable: Any, items: list[list[Any]], problems: list[str]
) -> str | None:
    """Fill `files` and the counters from the reused rows and the new `items`; its config.json hash."""
    answered = {item[0]: item for item in items}
    files = result["files"]
    for index, (rel, _) in enumerate(found):
        item = answered.get(index)
        if item is None:  # not answered: reused, its stat unchanged
            size, mtime_ns, inode, sha256 = reusable[rel]
            result["files_reused"] += 1
            result["bytes_reused"] += size
        elif len(item) == 2:
            problems.append(item[1])
            continue
        else:
            _, size, mtime_ns, inode, sha256 = item
            result["bytes_hashed"] += size
        files.append({"path": rel, "size": size, "mtime_ns": mtime_ns, "inode": inode, "sha256": sha256})
    # Plain str order: code point order equals UTF-8 byte order (names were checked to encode).
    files.sort(key=operator.itemgetter("path"))
    return next((f["sha256"] for f in files if f["path"] == CONFIG_FILE), None)


def _merged_previous(engines: list[str], previous: dict[str, Any]) -> dict[str, Any]:
    """Previous rows of every engine sharing one directory; reuse still demands an identical stat."""
    merged: dict[str, Any] = {}
    for engine in engines:
        rows = previous.get(engine)
        if isinstance(rows, dict):
            for rel, row in rows.items():
                merged.setdefault(rel, row)
    return merged


def collect_models(probe: Probe, params: dict[str, Any]) -> dict[str, Any]:
    """Hash each distinct model directory once (by real path) and report it under every engine using it."""
    by_dir: dict[str, list[str]] = {}
    for engine, model_dir in sorted(params["models"].items()):
        by_dir.setdefault(os.path.realpath(model_dir), []).append(engine)
    models: dict[str, Any] = {}
    for engines in by_dir.values():
        previous = _merged_previous(engines, params["previous"])
        root = params["models"][engines[0]]
        tree = hash_tree(root, previous, params["full_hash"], params["workers"])
        problems = tree.pop("problems")
        for message in problems:
            probe.error("checkpoint", f"{', '.join(engines)}: {message}")
        for engine in engines:
            models[engine] = dict(tree, model_dir=params["models"][engine], ok=not problems)
            if tree["unchanged"] and params["previous"].get(engine) != previous:  # another engine's rows
                models[engine].update(unchanged=False, files=_listed(previous))
    return models


def _listed(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """`hash_tree` files from reused rows, for an engine whose own previous table was not the one reused."""
    listed = []
    for rel in sorted(rows):
        size, mtime_ns, inode, sha256 = rows[rel]
        listed.append({"path": rel, "size": size, "mtime_ns": mtime_ns, "inode": inode, "sha256": sha256})
    return listed


# ---------------------------------------------------------------- entry point


def _load_params(raw: Any) -> dict[str, Any]:
    """Accept a JSON text or dict; fill defaults so collectors need no checks of their own."""
    params = json.loads(raw) if isinstance(raw, str) else dict(raw)
    models = params.get("models") or {}
    if not isinstance(models, dict) or not all(isinstance(v, str) for v in models.values()):
        raise ValueError("params.models must map engine names to directory paths")
    workers = params.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError("params.workers must be a positive integer or null")
    return {
        "image": params.get("image"),
        "models": models,
        "previous": params.get("previous") or {},
        "full_hash": bool(params.get("full_hash")),
        "workers": workers,
        "sysfs_net": params.get("sysfs_net") or SYSFS_NET,
        "sysfs_infiniband": params.get("sysfs_infiniband") or SYSFS_INFINIBAND,
        "dev_infiniband": params.get("dev_infiniband") or DEV_INFINIBAND,
        "known_packages": params.get("known_packages") or {},
    }


def collect(probe: Probe, params: dict[str, Any]) -> dict[str, Any]:
    """Gather every fact; each collector is guarded so one failure leaves the others intact."""
    probe.guard("hostname", probe.run, "hostname", ["hostname"])
    probe.guard("uname", probe.run, "uname", ["uname", "-r"])
    files = {name: probe.guard(name, read_text, paths) for name, paths in HOST_FILES.items()}
    probe.guard("nvidia-smi", probe.run, "nvidia-smi", NVIDIA_SMI_ARGV)
    probe.guard("ip", probe.run, "ip", IP_ARGV)
    speeds = probe.guard("link-speed", link_speeds, params["sysfs_net"])
    rdma = probe.guard("rdma", rdma_ports, params["sysfs_infiniband"])
    devices = probe.guard("rdma", character_devices, params["dev_infiniband"])
    known = probe.guard("docker", image_packages, probe, params) if params["image"] else None
    models = probe.guard("checkpoint", collect_models, probe, params)
    return {
        "files": files,
        "link_speeds": speeds or {},
        "rdma": rdma or [],
        "rdma_devices": devices or [],
        "image": params["image"],
        "packages_reused": known,
        "models": models or {},
    }


def build_document(raw_params: Any) -> dict[str, Any]:
    """The whole probe result as a dict (what `main` prints)."""
    started = time.monotonic()
    probe = Probe()
    facts: dict[str, Any] = {"files": {}, "link_speeds": {}, "rdma": [], "rdma_devices": [], "image": None,
                             "packages_reused": None, "models": {}}  # fmt: skip
    try:
        facts = collect(probe, _load_params(raw_params))
    except Exception as exc:
        probe.error("probe", f"internal error: {type(exc).__name__}: {exc}")
    document = {
        "schema": PROBE_SCHEMA,
        "schema_version": PROBE_SCHEMA_VERSION,
        "python": sys.version.split()[0],  # what platform.python_version() says, without importing it
        "tools": probe.tools,
        "errors": probe.errors,
        "log": probe.log,
    }
    document.update(facts)
    document["seconds"] = round(time.monotonic() - started, 3)
    return document


def main(raw_params: Any) -> None:
    """Print exactly one JSON document on stdout, whatever happens."""
    try:
        text = json.dumps(build_document(raw_params), sort_keys=True)
    except Exception as exc:
        failure = {"tool": "probe", "message": f"internal error: {type(exc).__name__}: {exc}"}
        text = json.dumps({"schema": PROBE_SCHEMA, "schema_version": PROBE_SCHEMA_VERSION, "errors": [failure]})
    sys.stdout.write(text + "\n")
    sys.stdout.flush()

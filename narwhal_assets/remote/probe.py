"""Discovery probe: runs on a fleet host as `python3 -` (source on stdin) and prints one JSON document.

Standard library only, Python 3.8+, ASCII source: hosts do not have this package. The workstation appends
`main('<json params>')` (`narwhal_assets.remote.probe_script`) and parses the document with
`narwhal_assets.remote.parse`. Tool output comes back raw so that parsing lives, and is tested, on the
workstation; the probe does only what must happen on the host: run tools, read sysfs, and hash
checkpoints, so that no checkpoint byte crosses the wire. It never dies with a traceback: every failure
becomes an entry of `errors` and the other facts are still collected.

The module imports cleanly as `narwhal_assets.remote.probe` so its hashing can be tested and benchmarked
locally.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PROBE_SCHEMA = "narwhal.probe"
PROBE_SCHEMA_VERSION = 1
LOG_LIMIT = 64 * 1024
OUTPUT_LIMIT = 16 * 1024 * 1024
READ_CHUNK = 4 * 1024 * 1024
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
CONFIG_FILE = "config.json"
CONFIG_LIMIT = 4 << 20


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
        entry = {
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
    """Every port under `<root>/<device>/ports/<n>` with its raw state, link layer, rate and netdevs."""
    ports = []
    for device in _listdir(root):
        netdevs = _listdir(os.path.join(root, device, "device", "net"))
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
                }
            )
    return ports


# ---------------------------------------------------------------- checkpoint trees


def _check_name(path: str, name: str) -> None:
    """Reject names the sha256sum line format cannot carry verbatim (it escapes them)."""
    if "\n" in name or "\\" in name:
        raise TreeError(f"{path}: file name contains a newline or backslash")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise TreeError(f"{path}: file name is not valid UTF-8") from None


def _classify_link(path: str) -> os.stat_result:
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
    return target


def _entry_stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    """The stat of a regular file (links followed); None for a directory; TreeError for anything else."""
    if entry.is_symlink():
        return _classify_link(entry.path)
    if entry.is_dir(follow_symlinks=False):
        return None
    if entry.is_file(follow_symlinks=False):
        return entry.stat(follow_symlinks=True)
    raise TreeError(f"{entry.path}: not a regular file (fifo, socket or device)")


def scan_tree(root: str) -> tuple[dict[str, tuple[str, os.stat_result]], list[str]]:
    """Map relative POSIX path -> (absolute path, stat) of every file under root, plus every problem."""
    files: dict[str, tuple[str, os.stat_result]] = {}
    problems: list[str] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as entries:
                listed = list(entries)
        except OSError as exc:
            problems.append(f"{os.path.join(root, rel_dir)}: {exc.strerror or exc}")
            continue
        for entry in listed:
            rel = rel_dir + "/" + entry.name if rel_dir else entry.name
            try:
                if rel == "-":
                    raise TreeError(f"{entry.path}: a top-level file named '-' is read as stdin by sha256sum")
                _check_name(entry.path, entry.name)
                info = _entry_stat(entry)
            except TreeError as exc:
                problems.append(str(exc))
                continue
            except OSError as exc:
                problems.append(f"{entry.path}: {exc.strerror or exc}")
                continue
            if info is None:
                pending.append(rel)
            else:
                files[rel] = (entry.path, info)
    return files, problems


def _fingerprint(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_size, info.st_mtime_ns, info.st_ino)


def digest_stream(handle: Any) -> tuple[str, int]:
    """SHA-256 and length of an unbuffered binary file, read in large chunks into one reused buffer.

    hashlib releases the GIL on large updates and so does the read, so threads hash files in parallel.
    """
    digest = hashlib.sha256()
    buffer = bytearray(READ_CHUNK)
    view = memoryview(buffer)
    total = 0
    while True:
        count = handle.readinto(buffer)
        if not count:
            break
        digest.update(view[:count])
        total += count
    return digest.hexdigest(), total


def hash_file(path: str) -> dict[str, Any]:
    """Hash one file, refusing it when size, mtime or inode moved while it was read."""
    before = os.stat(path)
    with open(path, "rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        sha256, count = digest_stream(handle)
    after = os.stat(path)
    if _fingerprint(before) != _fingerprint(after) or count != before.st_size:
        raise TreeError(f"{path}: changed while being read")
    return {"size": before.st_size, "mtime_ns": before.st_mtime_ns, "inode": before.st_ino, "sha256": sha256}


def _reusable(info: os.stat_result, previous: Any) -> str | None:
    """The previous sha256 when the stat fingerprint is unchanged, else None."""
    if not isinstance(previous, dict):
        return None
    sha256 = previous.get("sha256")
    same = (previous.get("size"), previous.get("mtime_ns"), previous.get("inode")) == _fingerprint(info)
    return sha256 if same and isinstance(sha256, str) else None


def _hash_all(todo: list[tuple[str, str]], workers: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Hash (rel, abs) pairs in a thread pool, largest first so one big file does not finish last."""
    results: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [(rel, path, pool.submit(hash_file, path)) for rel, path in todo]
        for rel, path, future in futures:
            try:
                results[rel] = future.result()
            except TreeError as exc:
                problems.append(str(exc))
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror or exc}")
    return results, problems


def _split_reusable(
    found: dict[str, tuple[str, os.stat_result]], previous: dict[str, Any], full: bool
) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
    """Files whose previous hash still holds, and the (rel, abs) pairs that must be read, largest first."""
    reused: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, str]] = []
    for rel, (path, info) in found.items():
        sha256 = None if full else _reusable(info, previous.get(rel))
        if sha256 is None:
            todo.append((rel, path))
        else:
            reused[rel] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "inode": info.st_ino, "sha256": sha256}
    todo.sort(key=lambda item: found[item[0]][1].st_size, reverse=True)
    return reused, todo


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
    """Per-file hashes of a checkpoint directory, reusing `previous` hashes of files whose stat is unchanged.

    Returns files (sorted by UTF-8 path bytes, each with path, size, mtime_ns, inode, sha256),
    config_sha256, bytes_hashed, bytes_reused, files_reused, seconds and problems (each naming a path).
    Nothing is read when the scan already found a problem: the tree could not be trusted anyway.
    """
    started = time.monotonic()
    result: dict[str, Any] = {"files": [], "config_sha256": None, "bytes_hashed": 0, "bytes_reused": 0}
    result["files_reused"] = 0
    if not os.path.isdir(root):
        reason = "not a directory" if os.path.exists(root) else "no such directory"
        result["problems"] = [f"{root}: {reason}"]
        return dict(result, seconds=round(time.monotonic() - started, 3))
    found, problems = scan_tree(root)
    if not problems:
        reused, todo = _split_reusable(found, previous or {}, full)
        hashed, problems = _hash_all(todo, workers or os.cpu_count() or 1)
        files = {**reused, **hashed}
        result["files"] = [dict(files[rel], path=rel) for rel in sorted(files, key=lambda rel: rel.encode("utf-8"))]
        result["bytes_hashed"] = sum(entry["size"] for entry in hashed.values())
        result["bytes_reused"] = sum(entry["size"] for entry in reused.values())
        result["files_reused"] = len(reused)
        result["config_sha256"] = files.get(CONFIG_FILE, {}).get("sha256")
        if result["config_sha256"] is None and not problems:
            problems = [f"{os.path.join(root, CONFIG_FILE)}: missing (the model configuration must be at the top)"]
        elif not problems:
            result["config_text"], problems = read_config(root, result["config_sha256"])
    return dict(result, problems=sorted(problems), seconds=round(time.monotonic() - started, 3))


def _merged_previous(engines: list[str], previous: dict[str, Any]) -> dict[str, Any]:
    """Previous hashes of every engine sharing one directory; reuse still demands an identical stat."""
    merged: dict[str, Any] = {}
    for engine in engines:
        entries = previous.get(engine)
        if isinstance(entries, dict):
            for rel, entry in entries.items():
                merged.setdefault(rel, entry)
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
    return models


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
    if params["image"]:
        probe.guard("docker", probe.run, "docker", ["docker", "image", "inspect", params["image"]])
    models = probe.guard("checkpoint", collect_models, probe, params)
    return {
        "files": files,
        "link_speeds": speeds or {},
        "rdma": rdma or [],
        "image": params["image"],
        "models": models or {},
    }


def build_document(raw_params: Any) -> dict[str, Any]:
    """The whole probe result as a dict (what `main` prints)."""
    started = time.monotonic()
    probe = Probe()
    facts: dict[str, Any] = {"files": {}, "link_speeds": {}, "rdma": [], "image": None, "models": {}}
    try:
        facts = collect(probe, _load_params(raw_params))
    except Exception as exc:
        probe.error("probe", f"internal error: {type(exc).__name__}: {exc}")
    document = {
        "schema": PROBE_SCHEMA,
        "schema_version": PROBE_SCHEMA_VERSION,
        "python": platform.python_version(),
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

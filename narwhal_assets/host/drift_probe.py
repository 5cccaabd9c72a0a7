"""Drift probe: runs on a fleet host in the transport's guard (`guard.py`, `-`: source on stdin, `-I -S`) and
prints one JSON document.

Standard library only, Python 3.8+, ASCII source. It is the cheap half of discovery: it runs the commands
the workstation names (argv lists, no shell), reads the machine id, stats every file of each model
directory (size, mtime, inode; symlinks to files followed as `find -L` does) and hashes only each model's
`config.json`. No other checkpoint byte is read. The workstation appends `main('<json params>')` and
compares the result with the latest discovery (`narwhal_assets.core.discovery.drift`). It never dies with a
traceback: failures become entries of `problems` (per model) or `errors`.

It runs on every host at every drift tick, so it imports only what it uses (`typing` only for type checkers,
plain threads rather than `concurrent.futures`, which imports `logging`): start-up is most of its cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading

TYPE_CHECKING = False  # the `typing.TYPE_CHECKING` idiom without importing `typing` at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

SCHEMA = "narwhal.drift-probe"
SCHEMA_VERSION = 1
OUTPUT_LIMIT = 1 << 20
CONFIG_FILE = "config.json"
EXCLUDED_PATH = ".cache/huggingface"  # hub download metadata: outside the tree digest (see probe.py)
CONFIG_LIMIT = 4 << 20
FILE_LIMIT = 1_000_000
COMMAND_TIMEOUT_S = 30.0
MACHINE_ID = "/etc/machine-id"


def run(argv: list[str]) -> dict[str, Any]:
    """One command without a shell, C locale, bounded in time and output; a missing tool reads as 127."""
    env = dict(os.environ, LC_ALL="C")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_TIMEOUT_S,
                              env=env, check=False)  # fmt: skip
        rc, out, err = done.returncode, done.stdout, done.stderr
    except FileNotFoundError:
        rc, out, err = 127, b"", b"command not found"
    except subprocess.TimeoutExpired:
        rc, out, err = 124, b"", b"timed out"
    except OSError as exc:
        rc, out, err = 126, b"", str(exc.strerror or exc).encode()
    return {"rc": rc, "stdout": _decode(out), "stderr": _decode(err)}


def _decode(data: bytes) -> str:
    return data[:OUTPUT_LIMIT].decode("utf-8", "replace")


def stat_tree(root: str) -> dict[str, Any]:
    """relative POSIX path -> [size, mtime_ns, inode] of every regular file (links to files followed)."""
    files: dict[str, list[int]] = {}
    problems: list[str] = []
    pending = [""]
    while pending and len(files) < FILE_LIMIT:
        rel_dir = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as entries:
                listed = list(entries)
        except OSError as exc:
            problems.append(f"{os.path.join(root, rel_dir)}: {exc.strerror or exc}")
            continue
        for entry in listed:
            rel = rel_dir + "/" + entry.name if rel_dir else entry.name
            if rel == EXCLUDED_PATH:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                    continue
                info = os.stat(entry.path)
            except OSError as exc:
                problems.append(f"{entry.path}: {exc.strerror or exc}")
                continue
            if stat.S_ISREG(info.st_mode):
                files[rel] = [info.st_size, info.st_mtime_ns, info.st_ino]
            else:
                problems.append(f"{entry.path}: not a regular file or a symlink to one")
    if pending:
        problems.append(f"{root}: more than {FILE_LIMIT} files")
    return {"files": files, "problems": problems}


def config_sha256(root: str) -> tuple[str | None, int, str | None]:
    """SHA-256 and length of the model's config.json (bounded), or a problem: the only file whose bytes are read."""
    path = os.path.join(root, CONFIG_FILE)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(CONFIG_LIMIT + 1)
    except OSError as exc:
        return None, 0, f"{path}: cannot read ({exc.strerror})"
    if len(raw) > CONFIG_LIMIT:
        return None, len(raw), f"{path}: larger than {CONFIG_LIMIT} bytes"
    return hashlib.sha256(raw).hexdigest(), len(raw), None


def model(root: str) -> dict[str, Any]:
    if not os.path.isdir(root):
        return {"model_dir": root, "files": {}, "problems": [f"{root}: not a directory"]}
    tree = stat_tree(root)
    digest, size, problem = config_sha256(root)
    problems = tree["problems"] + ([problem] if problem else [])
    return {"model_dir": root, "config_sha256": digest, "bytes_read": size, "files": tree["files"],
            "problems": problems}  # fmt: skip


def machine_id() -> str | None:
    try:
        with open(MACHINE_ID, encoding="ascii", errors="replace") as handle:
            return handle.read(256).strip()
    except OSError:
        return None


def in_parallel(jobs: dict[str, tuple[Callable[[Any], Any], Any]]) -> dict[str, Any]:
    """name -> (function, argument): every call in its own thread; name -> its result (re-raises the first
    exception in the caller, as `Future.result()` would)."""
    results: dict[str, Any] = {}
    failures: list[BaseException] = []

    def call(name: str, function: Callable[[Any], Any], argument: Any) -> None:
        try:
            results[name] = function(argument)
        except BaseException as exc:  # handed to the caller, never a traceback on stderr
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(name, *job)) for name, job in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results


def build_document(params: dict[str, Any]) -> dict[str, Any]:
    """Commands by name, and each engine's model directory (a directory shared by engines is read once).

    Commands and directory walks run at once: the probe's wall time is the slowest of them, not their sum.
    """
    document: dict[str, Any] = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tools": {}, "models": {}}
    document["errors"] = []
    document["machine_id"] = machine_id()
    try:
        dirs = {os.path.realpath(root): root for root in sorted(params["models"].values())}
        jobs: dict[str, tuple[Callable[[Any], Any], Any]] = {
            "tool:" + name: (run, [str(a) for a in argv]) for name, argv in params["commands"].items()
        }
        jobs.update({"dir:" + real: (model, root) for real, root in dirs.items()})
        results = in_parallel(jobs)
        document["tools"] = {name: results["tool:" + name] for name in sorted(params["commands"])}
        for engine, root in sorted(params["models"].items()):
            document["models"][engine] = dict(results["dir:" + os.path.realpath(root)], model_dir=root)
    except Exception as exc:
        document["errors"].append(f"internal error: {type(exc).__name__}: {exc}")
    return document


def main(raw_params: str) -> None:
    """Print exactly one JSON document on stdout, whatever happens."""
    try:
        text = json.dumps(build_document(json.loads(raw_params)), sort_keys=True)
    except Exception as exc:
        failure = f"internal error: {type(exc).__name__}: {exc}"
        text = json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "errors": [failure]})
    sys.stdout.write(text + "\n")
    sys.stdout.flush()

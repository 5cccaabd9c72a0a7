#!/usr/bin/env python3
"""Check, plan and start one engine from its role environment and per-engine launch file.

Runs on the engine host from `runs/deployment-tools/launch_engine.py` with the Python standard library only.
`check` proves the host still matches what was approved (image id, model config hash, machine id, and this
launcher's own bytes); `plan` prints the exact container command as JSON; `start` checks, then execs it.
Secret values travel in the docker client's environment (`-e NAME`), never on a command line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` on the host
if TYPE_CHECKING:  # annotations only: hosts may run Python 3.8
    from typing import Any

FILE_SCHEMA = "narwhal.engine-launch"
FILE_SCHEMA_VERSION = 1
FILE_FIELDS = ("role", "gpu_ids", "environment", "args", "network_mode", "accelerator_devices", "transfer", "runtime")
CONTAINER_HOOK_DIR = "/opt/narwhal-hook"
INSPECT_TIMEOUT_S = 120
EXIT_MISMATCH = 1
EXIT_USAGE = 2


class LaunchError(Exception):
    """A missing variable or an unusable launch file: nothing was checked or started."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"check": _check, "plan": _plan, "start": _start}
    try:
        return commands[args.command](args, dict(os.environ))
    except LaunchError as exc:
        print(f"launch_engine {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _check(args: argparse.Namespace, environ: dict[str, str]) -> int:
    return 0 if report(run_checks(environ, args.docker, args.machine_id_file)) else EXIT_MISMATCH


def _plan(args: argparse.Namespace, environ: dict[str, str]) -> int:
    argv, _, names = plan(environ, load_launch_file(environ), args.docker)
    print(json.dumps({"argv": argv, "environment": sorted(names)}, indent=2))
    return 0


def _start(args: argparse.Namespace, environ: dict[str, str]) -> int:
    """Check, then replace this process with docker so signals reach the container client directly."""
    argv, env, _ = plan(environ, load_launch_file(environ), args.docker)
    if not report(run_checks(environ, args.docker, args.machine_id_file)):
        return EXIT_MISMATCH
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_engine.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("check", "plan", "start"))
    parser.add_argument("--docker", default="docker", help="docker client to run (default: docker on PATH)")
    parser.add_argument("--machine-id-file", default="/etc/machine-id", type=Path,
                        help="where the host's machine id is read (default: /etc/machine-id)")
    return parser


def report(checks: list[tuple[str, bool, str]]) -> bool:
    """Print one line per check; True when all passed."""
    for name, ok, message in checks:
        print(f"{'ok' if ok else 'MISMATCH'}: {name}: {message}")
    return all(ok for _, ok, _ in checks)


def run_checks(environ: Mapping[str, str], docker: str, machine_id_file: Path) -> list[tuple[str, bool, str]]:
    """Image, model config, machine id (when one was approved) and this launcher's own SHA-256."""
    checks = [
        check_image(_require(environ, "NARWHAL_ENGINE_IMAGE"), docker),
        check_file_hash("model config", Path(_require(environ, "NARWHAL_MODEL_DIR")) / "config.json",
                        _require(environ, "NARWHAL_MODEL_CONFIG_SHA256"), "NARWHAL_MODEL_CONFIG_SHA256"),
        check_file_hash("launcher", Path(__file__).resolve(), _require(environ, "NARWHAL_ENGINE_LAUNCHER_SHA256"),
                        "NARWHAL_ENGINE_LAUNCHER_SHA256"),
    ]
    approved_machine = environ.get("NARWHAL_MACHINE_ID")
    if approved_machine:
        checks.append(check_machine_id(approved_machine, machine_id_file))
    return checks


def check_image(approved: str, docker: str) -> tuple[str, bool, str]:
    """`sha256:<id>` must be the local image's id; `name@sha256:<digest>` must be one of its repo digests."""
    try:
        done = subprocess.run([docker, "image", "inspect", approved], capture_output=True, text=True,
                              timeout=INSPECT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "image", False, f"cannot run {docker} image inspect ({type(exc).__name__})"
    try:
        image = json.loads(done.stdout)[0] if done.returncode == 0 else None
    except (ValueError, IndexError):
        image = None
    if not isinstance(image, dict):
        return "image", False, f"{approved} is not present on this host (docker image inspect failed)"
    if "@" in approved:
        digests = {d.rpartition("@")[2] for d in image.get("RepoDigests") or []}
        ok = approved.rpartition("@")[2] in digests
    else:
        ok = image.get("Id") == approved
    detail = "matches" if ok else f"local image id {image.get('Id')} differs from"
    return "image", ok, f"{detail} approved NARWHAL_ENGINE_IMAGE {approved}"


def check_file_hash(name: str, path: Path, approved: str, variable: str) -> tuple[str, bool, str]:
    try:
        actual = sha256_file(path)
    except OSError as exc:
        return name, False, f"cannot read {path} ({type(exc).__name__})"
    if actual == approved:
        return name, True, f"{path} SHA-256 matches {variable}"
    return name, False, f"{path} SHA-256 {actual} differs from approved {variable} {approved}"


def check_machine_id(approved: str, path: Path) -> tuple[str, bool, str]:
    try:
        actual = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return "machine id", False, f"cannot read {path} ({type(exc).__name__})"
    if actual == approved:
        return "machine id", True, "matches NARWHAL_MACHINE_ID"
    return "machine id", False, f"{actual} differs from approved NARWHAL_MACHINE_ID {approved}; wrong host?"


def load_launch_file(environ: Mapping[str, str]) -> dict[str, Any]:
    """The per-engine launch file named by `NARWHAL_ENGINE_LAUNCH_CONFIG`."""
    path = Path(_require(environ, "NARWHAL_ENGINE_LAUNCH_CONFIG"))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{path}: not a readable launch file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or (data.get("schema"), data.get("schema_version")) != (FILE_SCHEMA,
                                                                                         FILE_SCHEMA_VERSION):
        raise LaunchError(f"{path}: schema is not {FILE_SCHEMA} version {FILE_SCHEMA_VERSION}")
    for key in FILE_FIELDS:
        if key not in data:
            raise LaunchError(f"{path}: missing field {key}")
    role = data["role"]
    if not isinstance(role, str) or not role.startswith("engine-") or not role[7:].isdigit():
        raise LaunchError(f"{path}: role is not an engine role (engine-<n>)")
    return data


def plan(
    environ: Mapping[str, str], launch: dict[str, Any], docker: str = "docker"
) -> tuple[list[str], dict[str, str], set[str]]:
    """The docker argv, the environment to exec it with, and the names passed into the container.

    Every GPU of the host is visible to the container runtime (`--gpus all`) and the record's
    `CUDA_VISIBLE_DEVICES` (its own GPUs first, then colocated engines') decides what CUDA uses: CUDA IPC
    between colocated engines needs the peers' GPUs. The record's accelerator and transfer devices (RDMA's
    verbs nodes) are mapped one by one.
    """
    model_dir = _require(environ, "NARWHAL_MODEL_DIR")
    if not launch["args"] or launch["args"][0] != model_dir:
        raise LaunchError("NARWHAL_MODEL_DIR differs from the model directory in the launch file's args")
    passed = {**launch["runtime"].get("environment", {}), **launch["environment"]}
    mounts = ["-v", f"{model_dir}:{model_dir}:ro"]
    mounts += _capture(environ, passed)
    credential = _credential(environ)
    if credential is not None:
        passed["VLLM_API_KEY"] = credential
    argv = [docker, "run", "--rm", "--name", f"narwhal-{launch['role']}", "--network", launch["network_mode"],
            "--ipc", "host", "--gpus", "all"]
    for device in [*launch["accelerator_devices"], *launch["transfer"].get("devices", [])]:
        argv += ["--device", device]
    for name in sorted(passed):
        argv += ["-e", name]
    argv += [*mounts, "--entrypoint", "vllm", _require(environ, "NARWHAL_ENGINE_IMAGE"), "serve", *launch["args"]]
    return argv, {**environ, **passed}, set(passed)


def _capture(environ: Mapping[str, str], passed: dict[str, str]) -> list[str]:
    """With NARWHAL_CAPTURE_CACHE=1, mount the cache-capture hook as the container's sitecustomize."""
    if environ.get("NARWHAL_CAPTURE_CACHE") != "1":
        return []
    hook = Path(_require(environ, "NARWHAL_CACHE_CAPTURE_HOOK")).resolve()
    run_dir = Path(_require(environ, "NARWHAL_RUN_DIR")).resolve()
    passed.update(NARWHAL_CAPTURE_CACHE="1", NARWHAL_RUN_DIR=str(run_dir), PYTHONPATH=CONTAINER_HOOK_DIR)
    if environ.get("NARWHAL_CACHE_CAPTURE_PATH"):
        passed["NARWHAL_CACHE_CAPTURE_PATH"] = environ["NARWHAL_CACHE_CAPTURE_PATH"]
    return ["-v", f"{hook}:{CONTAINER_HOOK_DIR}/sitecustomize.py:ro", "-v", f"{run_dir}:{run_dir}"]


def _credential(environ: Mapping[str, str]) -> str | None:
    """The engine API key, from the variable `NARWHAL_ENGINE_API_KEY_ENV` names (default NARWHAL_ENGINE_API_KEY)."""
    name = environ.get("NARWHAL_ENGINE_API_KEY_ENV") or "NARWHAL_ENGINE_API_KEY"
    return environ.get(name) or None


def _require(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise LaunchError(f"{name} is unset or empty (load the engine role environment first)")
    return value


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main())

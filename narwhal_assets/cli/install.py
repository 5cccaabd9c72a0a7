"""`deploy-hosts install --run DIR`: materialize `host_installation` for the selected hosts as `install_job`.

The manifest is checked against the checkout for every host before any connection (exit 2). Each host is
its own run and partition event; up to `--max-parallel` run at once. With `--max-parallel 1` hosts run in
inventory order and the first failure stops the rest, as the upstream deployment helper does. A host where
the run is already installed and intact gets nothing sent; `current` is moved to it either way.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal_assets.core.errors import InputError, NarwhalError

if TYPE_CHECKING:  # Dagster and paramiko load only when the command runs (fast --help)
    from dagster import DagsterInstance

    from narwhal_assets.core.inputs.inventory import HostEntry
    from narwhal_assets.workflows.install import HostOutcome, Mode

EXIT_FAILED = 1
COMMAND = "install"
DEFAULT_PARALLEL = 8
# The packages dagster.yaml names for its storage classes: a worker would import them lazily to open the instance.
DAGSTER_STORAGE = [
    "narwhal_assets.runtime.instance_storage",
    "dagster._core.storage.event_log",
    "dagster._core.storage.runs",
    "dagster._core.storage.schedules",
]


def run_host(root: Path, run_dir: Path, host_id: str, mode: Mode = "install", command: str = COMMAND) -> HostOutcome:
    """One `install_job` run for one partition against the operator's instance; a failing gate comes back as
    the host's outcome. Runs in a worker process when hosts run in parallel: Dagster's in-process execution
    is not safe in several threads of one process (its log handlers and SQLite storage lock each other)."""
    from narwhal_assets.defs.installation.assets import INSTALLATION, install_job
    from narwhal_assets.runtime.runner import run_job
    from narwhal_assets.workflows.install import HostInstallFailure, HostOutcome

    config: dict[str, Any] = {"ops": {INSTALLATION.path[-1]: {"config": {"run_dir": str(run_dir), "mode": mode}}}}
    try:
        result = run_job(root, install_job.name, command, run_config=config, partition_key=host_id)
    except HostInstallFailure as failure:
        return failure.outcome or HostOutcome(host_id, gate=failure.gate, message=failure.message)
    except NarwhalError as exc:
        return HostOutcome(host_id, gate="input", message=str(exc).replace("\n", "; "))
    [event] = result.asset_materializations_for_node(INSTALLATION.path[-1])
    meta = {key: value.value for key, value in event.metadata.items()}
    return HostOutcome(
        host_id, str(meta["outcome"]), bytes_sent=int(meta["bytes_sent"]), files_sent=int(meta["files_sent"]),
        files_verified=int(meta["files_verified"]), seconds=float(meta["seconds"]),
    )  # fmt: skip


def run_host_in_worker(
    environ: dict[str, str], root: Path, run_dir: Path, host_id: str, mode: Mode, command: str
) -> HostOutcome:
    """`run_host` in a worker, with the caller's environment (the fork server's may be older); the worker
    closes its databases after each host since it will leave by `os._exit`, which skips `atexit`."""
    from narwhal_assets.runtime.instance_storage import close_databases

    os.environ.clear()
    os.environ.update(environ)
    try:
        return run_host(root, run_dir, host_id, mode, command)
    finally:
        close_databases()


def workers(count: int) -> ProcessPoolExecutor:
    """Worker processes forked from a server that imported this module, the code location and Dagster's storage
    (~0.7 s of CPU, 460 modules) once: cheap per host, no inherited threads or open storage from the caller."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "narwhal_assets.definitions", *DAGSTER_STORAGE])
    return ProcessPoolExecutor(max_workers=count, mp_context=context)


def instance_with_hosts(root: Path, host_ids: list[str]) -> DagsterInstance:
    """The operator's instance, with a `narwhal_hosts` partition for every inventory host (none removed)."""
    from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
    from narwhal_assets.runtime.runner import operator_instance

    instance = operator_instance(root)
    known = set(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME))
    missing = [host_id for host_id in host_ids if host_id not in known]
    if missing:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, missing)
    return instance


def run(args: argparse.Namespace) -> int:
    return run_partitions(args, "install", COMMAND)


def run_partitions(args: argparse.Namespace, mode: Mode, command: str) -> int:
    """`install_job` for each selected host's partition in `mode`, reporting each host; exit 1 on a failure."""
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.workflows.install import open_prepared_run

    if args.max_parallel < 1:
        raise InputError(["--max-parallel: must be 1 or more"])
    checkout = Checkout.open(args.root)
    entries = checkout.select(args.host or (), args.role or ())
    prepared = open_prepared_run(checkout.settings, checkout.inventory, args.run)
    instance_with_hosts(args.root, checkout.inventory.host_ids())
    manifest = prepared.manifest
    print(f"{command} {prepared.run_dir} revision {manifest.revision} into ~/{manifest.remote_dir}")
    outcomes: dict[str, HostOutcome] = {}
    if args.max_parallel == 1 or len(entries) == 1:
        for entry in entries:
            outcomes[entry.id] = run_host(args.root, prepared.run_dir, entry.id, mode, command)
            _show(entry, outcomes[entry.id])
            if not outcomes[entry.id].ok:
                break
    else:
        with workers(min(args.max_parallel, len(entries))) as pool:
            environ = dict(os.environ)
            futures = {e.id: pool.submit(run_host_in_worker, environ, args.root, prepared.run_dir, e.id, mode,
                                         command) for e in entries}  # fmt: skip
            for entry in entries:
                outcomes[entry.id] = futures[entry.id].result()
                _show(entry, outcomes[entry.id])
    skipped = [e.id for e in entries if e.id not in outcomes]
    for host_id in skipped:
        print(f"  {host_id:<10} not attempted: an earlier host failed (--max-parallel 1 stops at the first failure)")
    failed = [o for o in outcomes.values() if not o.ok]
    print(f"logs in {prepared.run_dir / 'logs'}")
    for outcome in failed:
        print(f"deploy-hosts {command}: host {outcome.host_id} failed at gate {outcome.gate!r}: {outcome.message}",
              file=sys.stderr)  # fmt: skip
    return EXIT_FAILED if failed or skipped else 0


def _show(entry: HostEntry, outcome: HostOutcome) -> None:
    print(f"  {entry.id:<10} roles={','.join(entry.roles):<18} {outcome.describe()}")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("install", help="install a prepared run on the selected hosts (install_job)",
                            description=__doc__)  # fmt: skip
    add_run_arguments(parser)
    parser.set_defaults(func=run)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`--run DIR`, the host selection and `--max-parallel`: shared by `install` and `rollback`."""
    parser.add_argument("--run", type=Path, required=True, metavar="DIR", help="the prepared directory")
    add_selection(parser)
    parser.add_argument("--max-parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                        help=f"hosts at once (default {DEFAULT_PARALLEL}); 1: inventory order, "
                        "stop at the first failure")  # fmt: skip


def add_selection(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--host", action="append", metavar="ID", help="physical host id (repeatable)")
    which.add_argument("--role", action="append", metavar="ROLE",
                       help="the host owning ROLE, colocated roles included (repeatable)")  # fmt: skip

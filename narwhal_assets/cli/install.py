"""`deploy-hosts install --run DIR` and `rollback --run DIR`: one fleet operation (`install_job` over the
selected hosts' `host_installation` partitions: the same run a UI backfill makes).

The manifest is checked against the checkout for every host before any connection (exit 2). Then the
operation takes its lease on every selected host (refusing, naming the holder, when another operation holds
one), stages every host that lacks the deployment and only then activates them (`--activate all`, the
default: if any host failed, none moves); `--activate each` moves each host as soon as it staged,
`--activate none` stages only (`rollback --run DIR` activates later). `--canary N` stages and activates the
first N selected hosts before any other is staged. Each host line says what happened to `current`. A host
already complete gets nothing sent. docs/install.md has the whole story.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from narwhal_assets.cli.selection import add_selection
from narwhal_assets.core.errors import InputError, RolloutFailed
from narwhal_assets.ssh.parallel import HOSTS_AT_ONCE  # the standard library only: --help stays fast

if TYPE_CHECKING:  # Dagster and paramiko load only when the command runs (fast --help)
    from dagster import DagsterInstance

    from narwhal_assets.core.inputs.inventory import HostEntry
    from narwhal_assets.workflows.install import Mode
    from narwhal_assets.workflows.rollout import Progress

EXIT_FAILED = 1
DEFAULT_PARALLEL = HOSTS_AT_ONCE
ACTIVATE_CHOICES = ("all", "each", "none")


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


def install(args: argparse.Namespace) -> int:
    return run_fleet(args, "install", "install")


def rollback(args: argparse.Namespace) -> int:
    return run_fleet(args, "activate", "rollback")


def run_fleet(args: argparse.Namespace, mode: Mode, command: str) -> int:
    """One `install_job` run over the selected hosts' partitions; one line per host; exit 1 when a host failed."""
    from narwhal_assets.defs.keys import INSTALLATION
    from narwhal_assets.defs.names import DEPLOYMENT_TAG, INSTALL_JOB, REVISION_TAG
    from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME, partition_span
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.runtime.instance_storage import close_databases
    from narwhal_assets.runtime.runner import run_job
    from narwhal_assets.workflows.install import open_prepared_run, stale_settings
    from narwhal_assets.workflows.lease import lease_seconds, message_problems
    from narwhal_assets.workflows.rollout import Progress

    problems = []
    if args.max_parallel < 1:
        problems.append("--max-parallel: must be 1 or more")
    if args.canary < 0:
        problems.append("--canary: must be 0 or more")
    if args.canary and args.activate == "none":
        problems.append("--canary: activates the canary hosts, --activate none activates no host: choose one")
    problems += message_problems(args.message or "")
    if problems:
        raise InputError(problems)
    checkout = Checkout.open(args.root)
    lease_seconds(checkout.settings)  # a bad NARWHAL_LEASE_S is refused before anything runs
    entries = checkout.select(args.host or (), args.role or ())
    prepared = open_prepared_run(checkout.settings, checkout.inventory, args.run)
    stale = stale_settings(checkout.settings, prepared) if mode == "install" else []
    if stale:
        said = (f"--run {prepared.run_dir}: prepared before {', '.join(stale)} changed; the hosts would get the "
                "prepared values: run deploy-hosts prepare for a new run")  # fmt: skip
        if args.strict:
            raise InputError([said])
        print(f"deploy-hosts {command}: warning: {said} (--strict refuses)", file=sys.stderr)
    instance = instance_with_hosts(args.root, checkout.inventory.host_ids())
    span, hosts = partition_span(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME), [e.id for e in entries])
    manifest = prepared.manifest
    print(f"{command} {prepared.run_dir} revision {manifest.revision} as {manifest.deployment_id} "
          f"into ~/{manifest.remote_dir}: stage {len(entries)} hosts, activate {args.activate}"
          + (f", canary {args.canary}" if args.canary else ""))  # fmt: skip
    config = {"run_dir": str(prepared.run_dir), "mode": mode, "hosts": hosts, "activate": args.activate,
              "canary": args.canary, "max_parallel": args.max_parallel, "message": args.message or ""}  # fmt: skip
    tags = {REVISION_TAG: manifest.revision, DEPLOYMENT_TAG: manifest.deployment_id, **span}
    progress = Progress()
    try:
        with suppress(RolloutFailed):  # every host's line follows
            run_job(args.root, INSTALL_JOB, command, run_config={"ops": {INSTALLATION.path[-1]: {"config": config}}},
                    tags=tags, progress=progress, instance=instance)  # fmt: skip
    finally:
        close_databases()  # checkpointed now, not at exit: a caller may go on in this process
        report(command, prepared.run_dir, entries, progress)
    outcomes = list(progress.outcomes.values())
    return 0 if len(outcomes) == len(entries) and all(o.ok for o in outcomes) else EXIT_FAILED


def report(command: str, run_dir: Path, selected: list[HostEntry], progress: Progress) -> None:
    """Each host's line, then what was not staged, where every host now runs, and what failed."""
    from narwhal_assets.workflows.rollout import where_hosts_run

    for host_id, holder in sorted(progress.broken.items()):
        print(f"host {host_id}: took over the stale lease of {holder.describe()}")
    outcomes = progress.outcomes
    if not outcomes:
        return  # nothing was staged (refused before any host, or a lease conflicted): the error says why
    for entry in selected:
        what = outcomes[entry.id].describe() if entry.id in outcomes else "not staged (a canary or an earlier "\
            "host failed)"
        print(f"  {entry.id:<10} roles={','.join(entry.roles):<18} {what}")
    done = [outcomes[e.id] for e in selected if e.id in outcomes]
    failed = [o for o in done if not o.ok]
    if failed and not any(o.activation == "activated" for o in done):
        print(f"none was activated: {', '.join(o.host_id for o in failed)} failed; a rerun sends nothing to the "
              "hosts that staged")  # fmt: skip
    elif failed:
        placed = where_hosts_run(done)
        print("now running: " + "; ".join(f"{where} on {', '.join(hosts)}" for where, hosts in placed.items()))
    if any(o.activation == "not activated" for o in done) and not failed:
        print(f"activate later with: deploy-hosts rollback --run {run_dir}")
    print(f"logs in {run_dir / 'logs'}")
    for outcome in failed:
        print(f"deploy-hosts {command}: host {outcome.host_id} failed at gate {outcome.gate!r}: {outcome.message}",
              file=sys.stderr)  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("install", help="install a prepared run on the selected hosts: stage all, then activate",
                            description=__doc__)  # fmt: skip
    add_run_arguments(parser)
    parser.add_argument("--strict", action="store_true", help="refuse a run prepared before a setting it "
                        "exports changed (default: warn, naming the settings)")  # fmt: skip
    parser.set_defaults(func=install)
    rb = sub.add_parser("rollback", help="make a previously installed prepared run current again (nothing sent)",
                        description=__doc__)  # fmt: skip
    add_run_arguments(rb)
    rb.set_defaults(func=rollback)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`--run DIR`, the host selection, `--activate`, `--canary`, `--max-parallel` and `--message`."""
    parser.add_argument("--run", type=Path, required=True, metavar="DIR", help="the prepared directory")
    add_selection(parser)
    parser.add_argument("--activate", choices=ACTIVATE_CHOICES, default="all",
                        help="all (default): move `current` only once every selected host staged; each: each "
                        "host as soon as it staged; none: stage only")  # fmt: skip
    parser.add_argument("--canary", type=int, default=0, metavar="N",
                        help="stage and activate the first N selected hosts before contacting any other")
    parser.add_argument("--max-parallel", type=int, default=DEFAULT_PARALLEL, metavar="N",
                        help=f"hosts at once (default {DEFAULT_PARALLEL}); with --activate each, 1: inventory "
                        "order, stop at the first failure")  # fmt: skip
    parser.add_argument("--message", default="", metavar="TEXT", help="said by every host's lease while this runs "
                        "(one line, at most 512 bytes)")  # fmt: skip

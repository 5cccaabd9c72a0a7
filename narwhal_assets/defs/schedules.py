"""Schedules: a weekly discovery that re-hashes every checkpoint byte, and the re-verification of installed hosts.

- `weekly_full_rehash`: incremental discovery trusts a file's previous hash while its size, mtime and inode
  are unchanged; the weekly full re-hash catches a change that kept all three.
- `reverify_installed_hosts`: every `NARWHAL_REVERIFY_CRON`, one `install_job` run over the host partitions
  whose latest installation is of the latest prepared run: the install reuse path, which sends nothing and
  fails a host whose installed content was tampered with. A host on another (or no) deployment is left
  alone (re-verifying it would install it) and named by `installed_from_latest_manifest`.

Both are stopped by default, like the sensors that open SSH connections.
"""

from __future__ import annotations

import os

import dagster as dg

from narwhal_assets.core.deployment.installed import CURRENT
from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.defs.installation.assets import install_job
from narwhal_assets.defs.installation.checks import installation_states
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.names import DEPLOYMENT_TAG, DISCOVERY_JOB, TRIGGER_TAG
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME, partition_span

REVERIFY_CRON_VARIABLE = "NARWHAL_REVERIFY_CRON"
DEFAULT_REVERIFY_CRON = "30 4 * * *"  # daily, 04:30 UTC
REVERIFY_TRIGGER = "reverify"

weekly_full_rehash = dg.ScheduleDefinition(
    name="weekly_full_rehash",
    job_name=DISCOVERY_JOB,
    cron_schedule="0 3 * * 0",
    execution_timezone="UTC",
    run_config={"ops": {"host_discovery": {"config": {"full_hash": True}}}},
    tags={TRIGGER_TAG: "weekly-full-rehash"},
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Sundays 03:00 UTC: discovery_job with full_hash: true, re-reading every checkpoint file "
    "instead of reusing hashes of files whose size, mtime and inode are unchanged.",
)


def reverify_requests(instance: dg.DagsterInstance) -> list[dg.RunRequest] | dg.SkipReason:
    """One `install_job` run over the host partitions installed from the latest manifest (one fleet
    operation under the lease, as `deploy-hosts install` is), with its run directory."""
    try:
        manifest, states = installation_states(instance)
    except NarwhalError as exc:
        return dg.SkipReason(f"nothing to re-verify: {exc}")
    if not states:
        return dg.SkipReason("nothing to re-verify: no narwhal_hosts partition (deploy-hosts install, or the "
                             "inventory_sensor, adds them)")  # fmt: skip
    current = [s.host_id for s in states if s.state == CURRENT]
    if not current:
        left = ", ".join(f"{s.host_id} ({s.state})" for s in states)
        return dg.SkipReason(f"nothing to re-verify: no host has {manifest.deployment_id} installed: {left}")
    span, hosts = partition_span(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME), current)
    config = {"ops": {INSTALLATION.path[-1]: {"config": {"run_dir": str(manifest.run_dir), "hosts": hosts}}}}
    tags = {TRIGGER_TAG: REVERIFY_TRIGGER, DEPLOYMENT_TAG: manifest.deployment_id, **span}
    return [dg.RunRequest(run_key=f"{manifest.deployment_id}:{','.join(current)}", run_config=config, tags=tags)]


def reverify_schedule(cron: str) -> dg.ScheduleDefinition:
    """The re-verification schedule on `cron` (UTC); a malformed expression is the operator's input error."""
    def reverify_installed_hosts(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        return reverify_requests(context.instance)

    try:
        return dg.schedule(
            name="reverify_installed_hosts",
            job=install_job,
            cron_schedule=cron,
            execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description=f"Every {REVERIFY_CRON_VARIABLE} (default '{DEFAULT_REVERIFY_CRON}', UTC): one install_job "
            "run over the host partitions installed from the latest deployment_manifest, with its run_dir. Sends "
            "nothing; a host whose installed content was tampered with fails at 'verify file'. Hosts on "
            "another deployment are not touched (see installed_from_latest_manifest).",
        )(reverify_installed_hosts)  # fmt: skip
    except dg.DagsterInvalidDefinitionError:
        raise InputError([f"{REVERIFY_CRON_VARIABLE}: expected a cron expression of five fields, "
                          f"like '{DEFAULT_REVERIFY_CRON}'"]) from None  # fmt: skip


reverify_installed_hosts = reverify_schedule(os.environ.get(REVERIFY_CRON_VARIABLE) or DEFAULT_REVERIFY_CRON)

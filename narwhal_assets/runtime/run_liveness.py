"""Runs whose process is gone end as failed: every run `deploy-hosts` starts names its process in its tags.

A command killed with SIGKILL (or a workstation that lost power) cannot record its run's end, so the run would
stay STARTED for good and `status` would read its hosts as drifting. Each run carries the workstation, boot,
pid and process start time of the command that executes it; the next command on that workstation that opens
the instance (`end_dead_runs`, called by `runtime.runner`) finds such runs whose process is gone and reports
them failed. Runs the UI's daemon launched are ended by Dagster's run monitoring (the instance's
`run_monitoring`, written by `runtime.runner`).
"""

from __future__ import annotations

import dagster as dg

from narwhal_assets.host.installer import start_ticks
from narwhal_assets.workflows.lease import this_process

WORKSTATION_TAG = "narwhal/workstation"
BOOT_TAG = "narwhal/boot"
PID_TAG = "narwhal/pid"
PID_START_TAG = "narwhal/pid_start"
UNFINISHED = [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING]  # fmt: skip


def process_tags() -> dict[str, str]:
    """This process, as the tags of a run it executes."""
    me = this_process()
    return {WORKSTATION_TAG: me["workstation"], BOOT_TAG: me["boot"], PID_TAG: str(me["pid"]),
            PID_START_TAG: me["pid_start"]}  # fmt: skip


def end_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Report every unfinished run of this workstation whose process is gone as failed; their ids."""
    me = this_process()
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED, tags={WORKSTATION_TAG: me["workstation"]}))
    ended = []
    for run in runs:
        tags = run.tags
        pid = tags.get(PID_TAG, "")
        alive = tags.get(BOOT_TAG) == me["boot"] and pid.isdigit() and start_ticks(int(pid)) == tags.get(PID_START_TAG)
        if not alive:
            instance.report_run_failed(run, message=f"the deploy-hosts process that ran it (pid {pid or '?'} on "
                                       f"{me['workstation']}) is gone: it was killed before it could record the "
                                       "run's end")  # fmt: skip
            ended.append(run.run_id)
    return ended

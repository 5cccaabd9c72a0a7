"""Schedules: a weekly discovery that re-hashes every checkpoint byte (`full_hash: true`).

Incremental discovery trusts a file's previous hash while its size, mtime and inode are unchanged; the
weekly full re-hash catches a change that kept all three. Stopped by default, like the sensors. The
periodic re-verification of installed hosts is added with the install assets.
"""

from __future__ import annotations

import dagster as dg

from narwhal_assets.sensors import DISCOVERY_JOB

weekly_full_rehash = dg.ScheduleDefinition(
    name="weekly_full_rehash",
    job_name=DISCOVERY_JOB,
    cron_schedule="0 3 * * 0",
    execution_timezone="UTC",
    run_config={"ops": {"host_discovery": {"config": {"full_hash": True}}}},
    tags={"narwhal.trigger": "weekly-full-rehash"},
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Sundays 03:00 UTC: discovery_job with full_hash: true, re-reading every checkpoint file "
    "instead of reusing hashes of files whose size, mtime and inode are unchanged.",
)

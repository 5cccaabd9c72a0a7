"""The re-verification schedule and the installed-from-latest check where nothing was prepared or installed, and
the schedule's cron setting. Runs and requests against prepared runs are in tests/fleet/test_reverify.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import dagster as dg
import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.installation.checks import evaluate_installed, installation_outdated_sensor
from narwhal_assets.defs.schedules import DEFAULT_REVERIFY_CRON, REVERIFY_CRON_VARIABLE, reverify_schedule

defs = code_location()  # the code location as Dagster loads it


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def test_nothing_prepared_skips_the_tick_and_the_check_says_so(instance: dg.DagsterInstance) -> None:
    instance.add_dynamic_partitions("narwhal_hosts", ["node-1"])
    context = dg.build_schedule_context(instance=instance, repository_def=defs.get_repository_def())
    data = reverify_schedule(DEFAULT_REVERIFY_CRON).evaluate_tick(context)
    assert not data.run_requests
    assert data.skip_message == ("nothing to re-verify: deployment_manifest has never been materialized; "
                                 "run `deploy-hosts prepare`")  # fmt: skip
    found = evaluate_installed(instance)
    assert not found.passed and found.description.startswith("not evaluated: deployment_manifest has never")
    sensed = installation_outdated_sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
    assert not sensed.asset_events and "nothing prepared yet" in sensed.skip_message


def test_the_schedule_is_stopped_on_a_cron_from_the_code_locations_environment() -> None:
    schedule = defs.get_repository_def().get_schedule_def("reverify_installed_hosts")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED and schedule.job_name == "install_job"
    assert schedule.cron_schedule == DEFAULT_REVERIFY_CRON == "30 4 * * *" and schedule.execution_timezone == "UTC"
    assert reverify_schedule("*/10 * * * *").cron_schedule == "*/10 * * * *"
    for bad in ("hourly", "* * * *", "61 * * * *", "0 0 31 2 *"):
        with pytest.raises(InputError) as raised:
            reverify_schedule(bad)
        assert str(raised.value) == f"{REVERIFY_CRON_VARIABLE}: expected a cron expression of five fields, like " \
                                    f"'{DEFAULT_REVERIFY_CRON}'"  # fmt: skip
    env = {**os.environ, REVERIFY_CRON_VARIABLE: "15 2 * * 1"}
    code = "from narwhal_assets.defs.schedules import reverify_installed_hosts as s; print(s.cron_schedule)"
    loaded = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                            check=False)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "15 2 * * 1"

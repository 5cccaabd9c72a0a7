"""Re-verification schedule and the `installed_from_latest_manifest` check against real sshd hosts.

Reuses the install tests' discovered git checkout (h1 router + engine-1, h2 password engine-2, h3 engine-3)
and their prepared-run fixture (tests/fleet/conftest.py), on a fleet of this module's own. Prepare and install
are the real `deploy-hosts` commands against the test's Dagster instance; the schedule's ticks are evaluated
with `build_schedule_context` on that instance and the runs they request are executed with `runner.run_job`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver  # Dagster's own per-partition staleness
from fleetsim import SimFleet
from helpers.deploy_hosts import cli
from helpers.install import install, manifest_of, outcomes, remote_dir

from narwhal_assets.core.errors import RolloutFailed
from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.installation.assets import host_installation
from narwhal_assets.defs.installation.checks import CHECK_NAME, evaluate_installed, installation_outdated_sensor
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.prepare.assets import prepare_deployment
from narwhal_assets.defs.schedules import reverify_installed_hosts
from narwhal_assets.runtime.runner import run_job

defs = code_location()  # the code location as Dagster loads it

HOSTS = ["node-1", "node-2", "node-3"]


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """The test's instance (DAGSTER_HOME), open for the whole test: an evaluation leaves Dagster's definitions
    state storage pointing at the instance it ran with."""
    with dg.DagsterInstance.get() as instance:
        yield instance


def tick(instance: dg.DagsterInstance) -> dg.ScheduleExecutionData:
    """One evaluation of the re-verification schedule, as the daemon evaluates it."""
    context = dg.build_schedule_context(instance=instance, repository_def=defs.get_repository_def())
    return reverify_installed_hosts.evaluate_tick(context)


def run_request(root: Path, instance: dg.DagsterInstance, request: dg.RunRequest) -> dict[str, dict[str, object]]:
    """Execute the requested run as the daemon would launch it: each host's event metadata in that run."""
    with contextlib.suppress(RolloutFailed):  # a host failed: its event says how
        run_job(root, request.job_name or "install_job", "reverify", run_config=request.run_config, tags=request.tags)
    [run] = instance.get_runs(limit=1)
    found: dict[str, dict[str, object]] = {}
    for kind in (dg.DagsterEventType.ASSET_OBSERVATION, dg.DagsterEventType.ASSET_MATERIALIZATION):
        for record in instance.get_records_for_run(run.run_id, of_type=kind).records:
            event = record.event_log_entry.asset_materialization or record.event_log_entry.asset_observation
            if event is not None and event.partition is not None and "outcome" in event.metadata:
                found[event.partition] = {key: value.value for key, value in event.metadata.items()}
    return found


def test_reverify_schedule_requests_installed_hosts_and_a_tampered_host_fails(
    discovered: Path, prepared: Path, fleet: SimFleet, instance: dg.DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not instance.get_dynamic_partitions("narwhal_hosts"), "prepare adds no host partition; install does"
    assert "no narwhal_hosts partition" in tick(instance).skip_message

    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0 and outcomes(out) == dict.fromkeys(HOSTS, "installed"), out + err
    [request] = tick(instance).run_requests  # one run over every host: one fleet operation under the lease
    assert (request.tags["dagster/asset_partition_range_start"], request.tags["dagster/asset_partition_range_end"]) \
        == (HOSTS[0], HOSTS[-1])  # fmt: skip
    config = {"ops": {"host_installation": {"config": {"run_dir": str(prepared), "hosts": []}}}}
    assert request.run_config == config and request.tags["narwhal/trigger"] == "reverify"
    assert dg.validate_run_config(defs.resolve_job_def("install_job"), config)

    target = remote_dir(fleet, "node-2", prepared) / "checkout" / "runs" / "deployment" / ".env.engine-2"
    target.write_bytes(b"export TAMPERED=1\n")
    results = run_request(discovered, instance, request)
    failed = results["node-2"]
    assert failed["outcome"] == "failed: verify file" and ".env.engine-2" in str(failed["message"])
    for host_id in ("node-1", "node-3"):
        meta = results[host_id]
        assert (meta["outcome"], meta["bytes_sent"], meta["files_sent"]) == ("reused", 0, 0)
        assert meta["deployment_id"] == manifest_of(prepared).deployment_id
    assert target.read_bytes() == b"export TAMPERED=1\n", "re-verification repairs nothing"
    [retried] = tick(instance).run_requests
    assert retried.tags["dagster/asset_partition_range_end"] == HOSTS[-1], "a failed re-verification is retried"

    rc, out, err = cli(discovered, "prepare", "--out", str(prepared.parent / "newer"), capsys=capsys)
    assert rc == 0, err
    behind = tick(instance)  # no host is on the latest prepared run: re-verifying would install it, so nothing runs
    assert not behind.run_requests and behind.skip_message.startswith("nothing to re-verify: no host has ")
    assert behind.skip_message.endswith("node-1 (outdated), node-2 (outdated), node-3 (outdated)")


def test_outdated_partitions_are_named_by_the_check_and_dagster_staleness_marks_every_partition(
    discovered: Path, prepared: Path, instance: dg.DagsterInstance, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, out + err
    old = manifest_of(prepared).deployment_id
    current = evaluate_installed(instance)
    assert current.passed and current.description == f"all 3 host(s) installed from {old}"
    [run] = instance.get_runs(limit=1)
    [evaluation] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    assert evaluation.dagster_event.event_specific_data.check_name == CHECK_NAME, "runs with every install"
    assert run.status == dg.DagsterRunStatus.SUCCESS

    newer = prepared.parent / "newer"
    rc, out, err = cli(discovered, "prepare", "--out", str(newer), capsys=capsys)
    assert rc == 0, err
    new = manifest_of(newer).deployment_id
    assert new != old
    outdated = evaluate_installed(instance)
    assert not outdated.passed and outdated.severity == dg.AssetCheckSeverity.WARN
    assert outdated.description == (f"not on the latest deployment {new}: node-1 (outdated: {old}), "
                                    f"node-2 (outdated: {old}), node-3 (outdated: {old})")  # fmt: skip
    rows = [r.data for r in outdated.metadata["hosts"].value.records]
    assert rows[0] == {"host": "node-1", "state": "outdated", "installed_deployment": old,
                       "installed_revision": manifest_of(prepared).revision, "latest_deployment": new}  # fmt: skip
    stale = get_stale_status_resolver(instance, [prepare_deployment, host_installation])
    assert {stale.get_status(INSTALLATION, h) for h in HOSTS} == {StaleStatus.STALE}
    assert stale.get_status(INSTALLATION) == StaleStatus.FRESH, "no asset-level staleness when partitioned"
    [cause] = stale.get_stale_causes(INSTALLATION, "node-1")
    assert cause.reason == "has a new dependency materialization"

    context = dg.build_sensor_context(instance=instance, definitions=defs)
    first = installation_outdated_sensor.evaluate_tick(context)
    [event] = first.asset_events
    assert isinstance(event, dg.AssetCheckEvaluation) and not event.passed
    again = dg.build_sensor_context(instance=instance, definitions=defs, cursor=first.cursor)
    assert not installation_outdated_sensor.evaluate_tick(again).asset_events

    rc, out, err = install(discovered, newer, capsys, "--host", "node-1")
    assert rc == 0, out + err
    found = evaluate_installed(instance)
    assert found.description == f"not on the latest deployment {new}: " + ", ".join(
        f"{host_id} (outdated: {old})" for host_id in ("node-2", "node-3"))

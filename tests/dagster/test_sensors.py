"""Inventory sensor, freshness policies and schedules evaluated against a real Dagster instance with the definitions.

No daemon and no hosts: ticks are evaluated with `build_sensor_context`; the checkout is real files. The drift
sensor needs hosts and is tested in tests/fleet/test_drift.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from narwhal_assets.definitions import defs as code_location
from narwhal_assets.definitions import make_definitions
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
from narwhal_assets.defs.resources import ManagementCheckout
from narwhal_assets.defs.schedules import weekly_full_rehash
from narwhal_assets.defs.sensors import inventory_sensor

defs = code_location()  # the code location as Dagster loads it

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"
SECRET = "SENTINEL-value-9b1f"
ENV = "NARWHAL_NODE_1_SSH=ops@gpu-a\nNARWHAL_NODE_2_SSH=ops@gpu-b\nNARWHAL_SSH_CONFIG=ssh_config\n"


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ssh_config").write_text("")  # isolated from the operator's ~/.ssh/config
    (tmp_path / ".env").write_text(ENV)
    return tmp_path


def tick(instance: dg.DagsterInstance, root: Path, cursor: str | None) -> dg.SensorExecutionData:
    """One evaluation of the inventory sensor; applies its partition requests as the daemon would."""
    context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                      resources={"checkout": ManagementCheckout(root=str(root))})  # fmt: skip
    data = inventory_sensor.evaluate_tick(context)
    for request in data.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    return data


def publish(root: Path, *names: str) -> None:
    """A completed discovery's manifest listing `names` with their current digests (what publish_config writes)."""
    run = root / "runs" / "discovery" / "20260101T000000Z-abcdef"
    run.mkdir(parents=True, exist_ok=True)
    files = {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in names}
    (run / "manifest.json").write_text(json.dumps({"schema": "narwhal.discovery-manifest", "files": files}))


def partitions(instance: dg.DagsterInstance) -> list[str]:
    return sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME))


def test_first_tick_requests_discovery_when_none_completed_and_registers_every_host(
    instance: dg.DagsterInstance, root: Path
) -> None:
    data = tick(instance, root, None)
    [request] = data.run_requests
    assert inventory_sensor.job_name == "discovery_job" and request.run_key.startswith("inputs-")
    assert partitions(instance) == ["node-1", "node-2"]
    cursor = json.loads(data.cursor)
    assert cursor[".env"] == hashlib.sha256(ENV.encode()).hexdigest()
    assert cursor["config/hosts.local.json"] == "absent" and cursor["ssh_config"] != "absent"


def test_no_change_requests_nothing_and_a_changed_input_requests_one_run(
    instance: dg.DagsterInstance, root: Path
) -> None:
    first = tick(instance, root, None)
    same = tick(instance, root, first.cursor)
    assert not same.run_requests and "inputs unchanged" in same.skip_message
    assert same.cursor == first.cursor

    (root / "ssh_config").write_text("Host gpu-a\n    Port 2222\n")
    changed = tick(instance, root, same.cursor)
    [request] = changed.run_requests
    assert request.run_key != first.run_requests[0].run_key
    assert partitions(instance) == ["node-1", "node-2"]


def test_what_discovery_itself_published_is_not_a_change_but_an_operator_edit_is(
    instance: dg.DagsterInstance, root: Path
) -> None:
    (root / "config").mkdir()
    deployment_env = root / "config" / "deployment.env"
    deployment_env.write_text("NARWHAL_NODE_1_IP=198.18.0.1\n")
    publish(root, "config/deployment.env")
    baseline = tick(instance, root, None)
    assert not baseline.run_requests, "a discovery completed: the first tick records a baseline"
    assert json.loads(baseline.cursor)["config/deployment.env"] == "published"

    deployment_env.write_text("NARWHAL_NODE_1_IP=198.18.0.9\n")  # the operator edits a generated file
    edited = tick(instance, root, baseline.cursor)
    assert len(edited.run_requests) == 1

    publish(root, "config/deployment.env")  # the discovery it requested rewrote and published it
    after = tick(instance, root, edited.cursor)
    assert not after.run_requests and json.loads(after.cursor)["config/deployment.env"] == "published"


def test_a_removed_host_loses_its_partition(instance: dg.DagsterInstance, root: Path) -> None:
    first = tick(instance, root, None)
    (root / ".env").write_text(ENV.replace("NARWHAL_NODE_2_SSH=ops@gpu-b\n", ""))
    data = tick(instance, root, first.cursor)
    [delete] = [r for r in data.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    assert list(delete.partition_keys) == ["node-2"]
    assert partitions(instance) == ["node-1"]
    assert len(data.run_requests) == 1


def test_a_broken_env_is_skipped_naming_file_and_line_never_the_value(instance: dg.DagsterInstance, root: Path) -> None:
    first = tick(instance, root, None)
    (root / ".env").write_text(ENV + f"NARWHAL_NODE_2_SSH_PASSWORD=$(echo {SECRET})\n")
    data = tick(instance, root, first.cursor)
    assert not data.run_requests and data.cursor == first.cursor, "kept, so the fix is seen as a change"
    assert f"{root / '.env'}:4: NARWHAL_NODE_2_SSH_PASSWORD:" in data.skip_message
    assert SECRET not in data.skip_message
    assert partitions(instance) == ["node-1", "node-2"]


def test_every_discovered_asset_has_dagsters_freshness_policy_from_the_checkouts_setting(root: Path) -> None:
    """The daemon judges the discovered set by Dagster's own freshness policy: `NARWHAL_DISCOVERY_MAX_AGE`
    (default 8 days) fails it, three quarters of it warns; a value that is no duration leaves the default."""

    def policies() -> set[dg.FreshnessPolicy | None]:
        specs = make_definitions(str(root)).resolve_all_asset_specs()
        return {spec.freshness_policy for spec in specs if spec.group_name == "discovery"}

    assert policies() == {dg.FreshnessPolicy.time_window(fail_window=timedelta(days=8), warn_window=timedelta(days=6))}
    (root / ".env").write_text(ENV + "NARWHAL_DISCOVERY_MAX_AGE=2h\n")
    assert policies() == {dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=2),
                                                         warn_window=timedelta(minutes=90))}  # fmt: skip
    (root / ".env").write_text(ENV + "NARWHAL_DISCOVERY_MAX_AGE=soon\n")
    assert policies() == {dg.FreshnessPolicy.time_window(fail_window=timedelta(days=8), warn_window=timedelta(days=6))}
    others = [s for s in make_definitions(str(root)).resolve_all_asset_specs() if s.group_name != "discovery"]
    assert others and all(s.freshness_policy is None for s in others), "prepared runs and installs are not timed"


def test_weekly_schedule_runs_a_full_rehash_with_config_the_job_accepts() -> None:
    context = dg.build_schedule_context(scheduled_execution_time=None)
    [request] = weekly_full_rehash.evaluate_tick(context).run_requests
    assert request.run_config == {"ops": {"host_discovery": {"config": {"full_hash": True}}}}
    job = defs.resolve_job_def("discovery_job")
    assert dg.validate_run_config(job, request.run_config)["ops"]["host_discovery"]["config"]["full_hash"] is True


def test_every_sensor_and_schedule_has_a_description_and_the_cli_lists_them(tmp_path: Path) -> None:
    repository = defs.get_repository_def()
    automation = {d.name: d.description for d in [*repository.sensor_defs, *repository.schedule_defs]}
    assert set(automation) == {"inventory_sensor", "rediscovery_sensor", "installation_outdated_sensor",
                               "weekly_full_rehash", "reverify_installed_hosts"}  # fmt: skip
    assert all(description and len(description) > 40 for description in automation.values())
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {"PATH": str(DAGSTER.parent) + ":/usr/bin:/bin", "DAGSTER_HOME": str(home)}
    listed = subprocess.run([str(DAGSTER), "sensor", "list", "-w", "workspace.yaml"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    for name in ("inventory_sensor", "rediscovery_sensor", "installation_outdated_sensor"):
        assert name in listed.stdout

"""The code location loads, validates with the `dagster` CLI, and materializes `host_inventory` from a checkout."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
from narwhal_assets.defs.resources import ManagementCheckout

defs = code_location()  # the code location as Dagster loads it

REPO = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"
needs_cli = pytest.mark.skipif(not DAGSTER.exists(), reason="the dagster CLI is not installed beside python")
DEST_1 = "SENTINEL-DEST-ops@gpu-a.example"
DEST_2 = "SENTINEL-DEST-gpu-b"


def cli_env(dagster_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(dagster_home)
    return env


def test_definitions_hold_the_inventory_asset_and_settings_resource() -> None:
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey("host_inventory")
    assert key in graph.get_all_asset_keys()
    assert graph.get(key).group_name == "discovery"
    assert isinstance(defs.resources["checkout"], ManagementCheckout)


@needs_cli
def test_dagster_definitions_validate(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(DAGSTER), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All code locations passed validation" in done.stdout + done.stderr


@needs_cli
def test_dagster_asset_materialize_from_a_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".env").write_text(f"NARWHAL_NODE_1_SSH='{DEST_1}'\nexport NARWHAL_NODE_2_SSH='{DEST_2}'\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    done = subprocess.run(
        [str(DAGSTER), "asset", "materialize", "-m", "narwhal_assets.definitions", "--select", "host_inventory"],
        cwd=checkout,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    path = checkout / "config" / "hosts.local.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert '"router"' in path.read_text() and "SENTINEL" not in path.read_text()
    assert "SENTINEL" not in output
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)) == ["node-1", "node-2"]
        [run] = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        logs = "\n".join(dg.serialize_value(entry) for entry in instance.all_logs(run.run_id))
        assert "host_inventory" in logs and "SENTINEL" not in logs


def test_dg_check_defs(tmp_path: Path) -> None:
    """`[tool.dg]` in pyproject.toml makes the project loadable by `dg` too (HOME isolated: dg writes there)."""
    dg_cli = Path(sys.executable).parent / "dg"
    env = {**cli_env(tmp_path / "dagster_home"), "HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [str(dg_cli), "check", "defs"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All definitions loaded successfully" in done.stdout + done.stderr
    output = (done.stdout + done.stderr).splitlines()
    warned = [line for line in output if "Warning" in line and "narwhal_assets" in line]
    assert not warned


def test_the_main_job_covers_the_discovery_group() -> None:
    job = defs.resolve_job_def("discovery_job")
    keys = {key.to_user_string() for key in job.asset_layer.selected_asset_keys}
    assert keys == {
        "host_inventory", "ssh_known_hosts", "host_observations", "checkpoint_digests",
        "deployment_env", "engine_launch_records", "fleet", "profiling_limits",
    }  # fmt: skip


def test_every_asset_has_its_owner_and_a_link_to_its_code_and_loading_warns_of_nothing() -> None:
    from narwhal_assets.defs.names import OWNERS

    for spec in defs.resolve_all_asset_specs():
        assert list(spec.owners) == OWNERS, spec.key
        assert "dagster/code_references" in spec.metadata, spec.key
    loaded = subprocess.run([sys.executable, "-W", "error", "-c", "import narwhal_assets.definitions as d; d.defs()"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert loaded.returncode == 0 and not loaded.stderr, loaded.stderr[-2000:]

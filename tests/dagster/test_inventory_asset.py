"""`host_inventory` materialized against a test instance: the file, the `narwhal_hosts` partitions, metadata."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import dagster as dg
import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.defs.discovery.assets import host_discovery
from narwhal_assets.defs.discovery.inventory import host_inventory
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings

DEST_A = "SENTINEL-DEST-ops@gpu-a.example"
DEST_B = "SENTINEL-DEST-gpu-b"
DEST_R = "SENTINEL-DEST-router-box"
PASSWORD = "SENTINEL-PW-s3cret"


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("NARWHAL_"):
            monkeypatch.delenv(name)
    root = tmp_path / "checkout"
    root.mkdir()
    return root


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def write_env(root: Path, **variables: str) -> None:
    (root / ".env").write_text("".join(f"{k}='{v}'\n" for k, v in variables.items()), encoding="utf-8")


def materialize(root: Path, instance: dg.DagsterInstance, **kwargs: object) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [host_inventory], instance=instance, resources={"checkout": ManagementCheckout(root=str(root))}, **kwargs
    )


def stored_text(instance: dg.DagsterInstance) -> str:
    """Everything the instance recorded: runs and every event of every run, serialized."""
    parts = []
    for run in instance.get_runs():
        parts.append(dg.serialize_value(run))
        parts.extend(dg.serialize_value(entry) for entry in instance.all_logs(run.run_id))
    records = instance.fetch_materializations(dg.AssetKey("host_inventory"), limit=1000).records
    parts.extend(dg.serialize_value(record) for record in records)
    # And the raw storage files (SQLite event log and run storage, compute logs).
    for path in Path(instance.root_directory).rglob("*"):
        if path.is_file():
            parts.append(path.read_bytes().decode("utf-8", "replace"))
    assert parts
    return "\n".join(parts)


def metadata_of(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    [event] = result.asset_materializations_for_node("host_inventory")
    return {key: value.value for key, value in event.metadata.items()}


def test_materialization_writes_inventory_and_partitions(checkout: Path, instance: dg.DagsterInstance) -> None:
    write_env(
        checkout,
        NARWHAL_NODE_1_SSH=DEST_A,
        NARWHAL_NODE_2_SSH=DEST_B,
        NARWHAL_NODE_2_SSH_PASSWORD=PASSWORD,
    )
    instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["stale-host", "node-1"])
    result = materialize(checkout, instance)
    assert result.success

    path = checkout / "config" / "hosts.local.json"
    doc = json.loads(path.read_text())
    assert [(h["id"], h["roles"]) for h in doc["hosts"]] == [
        ("node-1", ["router", "engine-1"]),
        ("node-2", ["engine-2"]),
    ]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)) == ["node-1", "node-2"]

    meta = metadata_of(result)
    assert meta["hosts"] == {"node-1": ["router", "engine-1"], "node-2": ["engine-2"]}
    assert meta["password_hosts"] == ["node-2"]
    assert meta["partitions_added"] == ["node-2"]
    assert meta["partitions_removed"] == ["stale-host"]
    assert meta["path"] == str(path.resolve())
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "SENTINEL" not in path.read_text()
    stored = stored_text(instance)
    assert '"node-2"' in stored and "SENTINEL" not in stored


def test_rematerialization_follows_the_inventory(checkout: Path, instance: dg.DagsterInstance) -> None:
    write_env(checkout, NARWHAL_NODE_1_SSH=DEST_A, NARWHAL_NODE_2_SSH=DEST_B)
    assert materialize(checkout, instance).success
    assert sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)) == ["node-1", "node-2"]

    # Unchanged input: nothing added or removed, same digest.
    first_digest = metadata_of(materialize(checkout, instance))["sha256"]
    again = metadata_of(materialize(checkout, instance))
    assert again["partitions_added"] == [] and again["partitions_removed"] == []
    assert again["sha256"] == first_digest

    # The operator moves everything to other machines and derives the inventory again.
    (checkout / "config" / "hosts.local.json").unlink()
    write_env(checkout, NARWHAL_ROUTER_SSH=DEST_R, NARWHAL_NODE_2_SSH=DEST_B, NARWHAL_NODE_3_SSH=DEST_B)
    result = materialize(checkout, instance)
    meta = metadata_of(result)
    assert meta["hosts"] == {"router": ["router"], "node-2": ["engine-2", "engine-3"]}
    assert meta["partitions_added"] == ["router"]
    assert meta["partitions_removed"] == ["node-1"]
    assert sorted(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME)) == ["node-2", "router"]
    assert "SENTINEL" not in stored_text(instance)


def test_bad_input_fails_the_step_with_secret_free_lines(checkout: Path, instance: dg.DagsterInstance) -> None:
    write_env(checkout, NARWHAL_NODE_1_SSH=DEST_A, NARWHAL_NODE_1_SSH_PASSWORD="")
    instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["kept"])
    result = materialize(checkout, instance, raise_on_error=False)
    assert not result.success
    assert not (checkout / "config").exists()
    assert instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME) == ["kept"]
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    messages = []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    expected = (
        f"{checkout.resolve() / '.env'} (derived inventory): hosts[0].password_env: variable "
        "NARWHAL_NODE_1_SSH_PASSWORD is unset or empty (set it in .env)"
    )
    assert any(expected in message for message in messages)
    assert "SENTINEL" not in stored_text(instance)


def test_invalid_env_file_fails_without_echoing_the_value(checkout: Path, instance: dg.DagsterInstance) -> None:
    (checkout / ".env").write_text(f"NARWHAL_NODE_1_SSH={DEST_A}$(cat {PASSWORD})\n")
    # execute_in_process re-raises the asset's own exception.
    with pytest.raises(InputError) as info:
        materialize(checkout, instance)
    assert info.value.problems == [
        f"{checkout.resolve() / '.env'}:1: NARWHAL_NODE_1_SSH: needs a shell to evaluate (expansion or command "
        "substitution)"
    ]
    assert "SENTINEL" not in stored_text(instance)
    assert not (checkout / "config").exists()


def test_a_discovery_with_bad_engine_input_saves_no_inventory(checkout: Path, instance: dg.DagsterInstance) -> None:
    """Materialized with the host discovery (as the UI's discovery group or the discovery job run it), the
    inventory is saved only once every input discovery can check without a host is good: a saved inventory
    would outlive the fix and refuse a colocation chosen in `.env` afterwards."""
    write_env(checkout, NARWHAL_NODE_1_SSH=DEST_A, NARWHAL_NODE_2_SSH=DEST_B, NARWHAL_ENGINE_MODEL_NAME="m",
              NARWHAL_ENGINE_IMAGE="engine:1", NARWHAL_RUN_DIR="/var/tmp/run", NARWHAL_FABRIC_INTERFACE="fab0")
    resources = {"checkout": ManagementCheckout(root=str(checkout)), "ssh": SshSettings()}
    result = dg.materialize([host_inventory, host_discovery], instance=instance, resources=resources,
                            raise_on_error=False)  # fmt: skip
    assert not result.success
    assert not (checkout / "config").exists() and not (checkout / "runs").exists()
    [failure] = result.get_step_failure_events()
    assert failure.step_key == "host_inventory"
    error, messages = failure.step_failure_data.error, []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    assert any("engine-1: NARWHAL_MODEL_DIR is unset" in message for message in messages)
    assert materialize(checkout, instance).success  # alone, the inventory asset needs no engine setting

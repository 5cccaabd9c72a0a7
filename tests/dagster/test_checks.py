"""Asset checks fail with a description naming what is wrong (direct invocation, no hosts needed)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.discovery.checks import (
    GENERATED_FILES,
    PRIVATE_CHECK,
    known_hosts_cover_inventory,
    private_modes_result,
)
from narwhal_assets.defs.resources import ManagementCheckout

defs = code_location()  # the code location as Dagster loads it

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRlY2hlY2sta2V5LWZvci10aGUtY2hlY2stdGVzdHMt"  # a well-formed key


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "ssh_config").write_text("")  # isolated from the operator's ~/.ssh/config
    (tmp_path / ".env").write_text(
        f"NARWHAL_NODE_1_SSH=ops@gpu-a\nNARWHAL_NODE_2_SSH=ops@gpu-b\nNARWHAL_SSH_CONFIG={tmp_path}/ssh_config\n"
    )
    (tmp_path / "config").mkdir(mode=0o700)
    return tmp_path


def test_private_modes_check_names_the_loose_file(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    fleet = root / "config" / "fleet.json"
    fleet.write_text("{}")
    fleet.chmod(0o644)
    key = dg.AssetKey("fleet")
    result = private_modes_result(Settings.load(root), key)
    assert not result.passed
    assert result.description == f"{fleet}: mode 0644, expected 0600"
    fleet.chmod(0o600)
    assert private_modes_result(Settings.load(root), key).passed
    # Directories are walked: a loose file deep in a discovery run is named.
    log = root / "runs" / "discovery" / "r1" / "logs" / "node-1.log"
    log.parent.mkdir(parents=True, mode=0o700)
    (root / "runs").chmod(0o700)
    (root / "runs" / "discovery").chmod(0o700)
    (root / "runs" / "discovery" / "r1").chmod(0o755)
    log.write_text("x")
    log.chmod(0o600)
    result = private_modes_result(Settings.load(root), dg.AssetKey("host_observations"))
    assert result.description == f"{log.parent.parent}: mode 0755, expected 0700"


def test_every_discovered_asset_has_the_private_modes_check() -> None:
    """Every asset of the discovery group (prepared deployments have their own `prepared_files_private`)."""
    graph = defs.resolve_asset_graph()
    generated = {key for key in graph.get_all_asset_keys() if graph.get(key).group_name == "discovery"}
    checked = {key.asset_key for key in graph.asset_check_keys if key.name == PRIVATE_CHECK}
    assert checked == generated == {dg.AssetKey(name) for name in GENERATED_FILES}


def test_known_hosts_check_names_hosts_without_a_recorded_key(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    store = root / "config" / "ssh.known_hosts"
    store.write_text(f"gpu-a {KEY}\n")
    result = known_hosts_cover_inventory(checkout=ManagementCheckout(root=str(root)))
    assert not result.passed and result.description == "no recorded key for: node-2"
    store.write_text(f"gpu-a {KEY}\ngpu-b {KEY}\n")
    assert known_hosts_cover_inventory(checkout=ManagementCheckout(root=str(root))).passed


def test_the_inventory_check_covers_the_dagster_instance(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    instance_dir = root / "runs" / "dagster"
    instance_dir.mkdir(parents=True, mode=0o700)
    (root / "runs").chmod(0o700)
    db = instance_dir / "runs.db"
    db.write_text("")
    db.chmod(0o644)
    result = private_modes_result(Settings.load(root), dg.AssetKey("host_inventory"), instance_dir)
    assert not result.passed and result.description == f"{db}: mode 0644, expected 0600"
    db.chmod(0o600)
    assert private_modes_result(Settings.load(root), dg.AssetKey("host_inventory"), instance_dir).passed


def test_each_hosts_latest_successful_install_is_read_in_one_pass() -> None:
    """Per partition the newest materialization wins; a later failed install (an observation), another
    asset's or another partition's event does not count; a host never installed is None."""
    from narwhal_assets.defs.installation.checks import latest_installs
    from narwhal_assets.defs.keys import INSTALLATION
    from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME

    def installed(host: str, deployment: str) -> None:
        instance.report_runless_asset_event(dg.AssetMaterialization(
            INSTALLATION, partition=host, metadata={"deployment_id": deployment, "revision": "r-" + deployment}))

    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["node-1", "node-2", "node-3", "node-4"])
        installed("node-1", "d1")
        installed("node-2", "d1")
        installed("node-1", "d2")
        instance.report_runless_asset_event(dg.AssetObservation(
            INSTALLATION, partition="node-1", metadata={"deployment_id": "d3", "revision": "r-d3"}))
        instance.report_runless_asset_event(dg.AssetMaterialization(
            "another_asset", metadata={"deployment_id": "d9", "revision": "r-d9"}))
        installed("node-4", "d4")
        found = latest_installs(instance, ["node-1", "node-2", "node-3"])
    assert {host: (i.deployment_id, i.revision) if i else None for host, i in found.items()} == {
        "node-1": ("d2", "r-d2"), "node-2": ("d1", "r-d1"), "node-3": None}
    with dg.DagsterInstance.ephemeral() as empty:
        assert latest_installs(empty, []) == {}

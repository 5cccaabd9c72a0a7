"""Asset checks fail with a description naming what is wrong (direct invocation, no hosts needed)."""

from __future__ import annotations

from pathlib import Path

from narwhal_assets.assets.checks import generated_files_private, known_hosts_cover_inventory
from narwhal_assets.resources import NarwhalSettings

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBl0ZWNoZWNrLWtleS1mb3ItdGhlLWNoZWNrLXRlc3RzLTEyMzQ"


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
    result = generated_files_private(narwhal=NarwhalSettings(root=str(root)))
    assert not result.passed
    assert result.description == f"{fleet}: mode 0644, expected 0600"
    fleet.chmod(0o600)
    assert generated_files_private(narwhal=NarwhalSettings(root=str(root))).passed


def test_known_hosts_check_names_hosts_without_a_recorded_key(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    store = root / "config" / "ssh.known_hosts"
    store.write_text(f"gpu-a {KEY}\n")
    result = known_hosts_cover_inventory(narwhal=NarwhalSettings(root=str(root)))
    assert not result.passed and result.description == "no recorded key for: node-2"
    store.write_text(f"gpu-a {KEY}\ngpu-b {KEY}\n")
    assert known_hosts_cover_inventory(narwhal=NarwhalSettings(root=str(root))).passed

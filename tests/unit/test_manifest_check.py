"""The manifest check `install` and role shells run before contacting any host: every mismatch named."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.prepared_run.manifest import DeploymentManifest, ManifestHost, PreparedFile, remote_dir_for
from narwhal_assets.core.prepared_run.manifest_check import (
    FIX,
    REDISCOVER_FIX,
    CurrentAccess,
    destination_sha256,
    expected_targets,
    load_manifest,
    verify_manifest,
)

REVISION = "a" * 40
DEPLOYMENT = "0123456789abcdef0123456789abcdef"
FP_1 = "SHA256:" + "A" * 43
FP_2 = "SHA256:" + "B" * 43
DEST = {"node-1": "ops@gpu-a.sentinel", "node-2": "gpu-b.sentinel"}
INVENTORY = Inventory(hosts=[
    HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1"]),
    HostEntry(id="node-2", ssh_env="NARWHAL_NODE_2_SSH", password_env="NARWHAL_NODE_2_SSH_PASSWORD",
              roles=["engine-2"]),
])  # fmt: skip


def write(run: Path, rel: str, data: bytes, install_to: str | None = None, keep: bool = False) -> PreparedFile:
    path = run / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return PreparedFile(path=rel, install_to=install_to, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                        keep_if_present=keep)  # fmt: skip


def make_run(run: Path) -> DeploymentManifest:
    """A prepared directory as `prepare` lays it out: `<host-id>/<file>`, installed where the roles need."""
    hosts = []
    for entry in INVENTORY.hosts:
        files = []
        for target, keep in expected_targets(entry.roles).items():
            name = "fleet.local.json" if target.endswith("/fleet.json") else target.rsplit("/", 1)[1]
            files.append(write(run, f"{entry.id}/{name}", f"{entry.id} {name}\n".encode(), target, keep))
        pinned = [FP_1] if entry.id == "node-1" else [FP_2]
        hosts.append(ManifestHost(id=entry.id, ssh_env=entry.ssh_env, password_env=entry.password_env,
                                  roles=entry.roles, destination_sha256=destination_sha256(DEST[entry.id]),
                                  host_key_fingerprints=pinned, files=files))  # fmt: skip
    manifest = DeploymentManifest(revision=REVISION, deployment_id=DEPLOYMENT, remote_dir=remote_dir_for(DEPLOYMENT),
                                  created_at="2026-12-01T00:00:00Z", bundle=write(run, "source.bundle", b"bundle"),
                                  hosts=hosts)  # fmt: skip
    (run / "manifest.json").write_text(manifest.model_dump_json(by_alias=True, indent=2))
    return manifest


def current(**changes: CurrentAccess) -> dict[str, CurrentAccess]:
    now = {"node-1": CurrentAccess(destination_sha256(DEST["node-1"]), (FP_1,)),
           "node-2": CurrentAccess(destination_sha256(DEST["node-2"]), (FP_2,))}  # fmt: skip
    now.update({key.replace("_", "-"): value for key, value in changes.items()})
    return now


def problems(run: Path, inventory: Inventory = INVENTORY, **changes: CurrentAccess) -> list[str]:
    with pytest.raises(InputError) as raised:
        verify_manifest(run, load_manifest(run), inventory, current(**changes))
    assert all(line.endswith((FIX, REDISCOVER_FIX)) for line in raised.value.problems)
    return raised.value.problems


def test_expected_targets_follow_the_roles() -> None:
    assert expected_targets(["router", "engine-1"]) == {
        "runs/deployment/.env.router": False,
        "runs/deployment/fleet.json": True,
        "runs/deployment/profiling-limits.json": False,
        "runs/deployment/.env.engine-1": False,
        "config/engine-launch.engine-1.json": False,
        "runs/deployment-tools/launch_engine.py": False,
        "runs/deployment-tools/fabric_budget.py": False,
        "runs/deployment-tools/cache_capture_hook.py": False,
    }
    assert set(expected_targets(["router"])) == {"runs/deployment/.env.router", "runs/deployment/fleet.json",
                                                 "runs/deployment/profiling-limits.json"}  # fmt: skip


def test_a_consistent_run_passes(tmp_path: Path) -> None:
    make_run(tmp_path)
    verify_manifest(tmp_path, load_manifest(tmp_path), INVENTORY, current())


def test_changed_prepared_files_are_each_named(tmp_path: Path) -> None:
    make_run(tmp_path)
    (tmp_path / "node-2" / ".env.engine-2").write_bytes(b"node-2 .env.engine-X\n")  # same size, other bytes
    (tmp_path / "node-1" / "fleet.local.json").write_bytes(b"{}")
    (tmp_path / "source.bundle").unlink()
    (tmp_path / "source.bundle").symlink_to(tmp_path / "node-1" / ".env.router")
    found = problems(tmp_path)
    assert any(f"{tmp_path}/node-2/.env.engine-2: content differs from its pinned SHA-256" in p for p in found)
    assert any(f"{tmp_path}/node-1/fleet.local.json: size 2 differs" in p for p in found)
    assert any(f"{tmp_path}/source.bundle: not a regular file" in p for p in found)
    assert len(found) == 3


@pytest.mark.parametrize("keys_now", [(), (FP_1,)], ids=["no-key-for-the-new-endpoint", "another-hosts-key"])
def test_a_changed_destination_is_one_line_with_the_whole_way(tmp_path: Path, keys_now: tuple[str, ...]) -> None:
    """The store's keys for the new endpoint are no key change: only the destination is reported, with every
    step back to an installable run."""
    make_run(tmp_path)
    found = problems(tmp_path, node_2=CurrentAccess(destination_sha256("other.sentinel"), keys_now))
    assert found == [f"{tmp_path}/manifest.json: hosts[node-2].destination_sha256: the destination in "
                     "NARWHAL_NODE_2_SSH changed since this run was prepared; run `deploy-hosts discover`, then "
                     "`deploy-hosts prepare`, then install the new run"]  # fmt: skip


def test_a_changed_host_key_names_the_host_never_the_value(tmp_path: Path) -> None:
    make_run(tmp_path)
    found = problems(tmp_path, node_2=CurrentAccess(destination_sha256(DEST["node-2"]), (FP_1,)))
    assert found == [f"{tmp_path}/manifest.json: hosts[node-2].host_key_fingerprints: differ from the keys pinned in "
                     f"the known-hosts store now; {FIX}"]  # fmt: skip
    unset = problems(tmp_path, node_1=CurrentAccess(None, ()))
    assert unset == [f"{tmp_path}/manifest.json: hosts[node-1]: NARWHAL_NODE_1_SSH is unset now; {FIX}"]
    assert not any("sentinel" in line for line in found + unset)


def test_inventory_changes_are_named(tmp_path: Path) -> None:
    make_run(tmp_path)
    moved = Inventory(hosts=[
        HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1"]),
        HostEntry(id="node-2", ssh_env="NARWHAL_NODE_2_SSH", roles=["engine-2"]),
        HostEntry(id="node-3", ssh_env="NARWHAL_NODE_3_SSH", roles=["engine-3"]),
    ])  # fmt: skip
    found = problems(tmp_path, moved, node_3=CurrentAccess(destination_sha256("c"), (FP_2,)))
    assert any("hosts[node-2].password_env: differs from the current inventory" in p for p in found)
    assert any("hosts: inventory host node-3 is not in the prepared run" in p for p in found)


def test_the_file_list_must_equal_what_the_roles_need(tmp_path: Path) -> None:
    manifest = make_run(tmp_path)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    node1 = raw["hosts"][0]
    node1["files"] = [f for f in node1["files"] if f["install_to"] != "config/engine-launch.engine-1.json"]
    for f in node1["files"]:
        if f["install_to"] == "runs/deployment/fleet.json":
            f["keep_if_present"] = False
    extra = write(tmp_path, "node-2/extra.sh", b"echo\n", "runs/deployment/extra.sh")
    raw["hosts"][1]["files"].append(extra.model_dump())
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    found = problems(tmp_path)
    assert any("hosts[node-1].files: nothing is installed to config/engine-launch.engine-1.json" in p for p in found)
    assert any("hosts[node-1].files: runs/deployment/fleet.json: keep_if_present must be true" in p for p in found)
    assert any("hosts[node-2].files: runs/deployment/extra.sh is not a file its roles need" in p for p in found)
    assert manifest.hosts[0].id == "node-1"


def test_unreadable_or_malformed_manifests_name_the_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"manifest.json: not found; prepare a new run"):
        load_manifest(tmp_path)
    make_run(tmp_path)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**raw, "revision": "main"}))
    with pytest.raises(InputError) as raised:
        load_manifest(tmp_path)
    assert [p.split(": ")[:2] for p in raised.value.problems] == [[f"{tmp_path}/manifest.json", "revision"]]
    (tmp_path / "manifest.json").write_text(json.dumps({**raw, "remote_dir": "../../etc"}))
    with pytest.raises(InputError, match=r"remote_dir must be Narwhal-deploy/<deployment_id>"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(InputError, match="not a readable JSON manifest"):
        load_manifest(tmp_path)


def test_a_run_prepared_in_the_previous_format_is_refused_in_one_line_never_misread(tmp_path: Path) -> None:
    make_run(tmp_path)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**raw, "schema_version": 1}))
    with pytest.raises(InputError) as raised:
        load_manifest(tmp_path)
    assert raised.value.problems == [f"{tmp_path}: prepared with format 1, re-run prepare (this version reads format "
                                     "2: `deploy-hosts prepare`)"]  # fmt: skip


def test_an_unreadable_prepared_file_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    make_run(tmp_path)
    fifo = tmp_path / "node-2" / ".env.engine-2"
    fifo.unlink()
    os.mkfifo(fifo)
    found = problems(tmp_path)
    assert len(found) == 1 and "node-2/.env.engine-2: not a regular file" in found[0]

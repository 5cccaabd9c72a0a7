"""Every file the serving fleet reads, as discovery and prepare generate it, passes that reader's rules.

The rules (`helpers.fleet_readers`) restate the public readers of the Narwhal repository: the router's fleet
loader, the profiler's limits loader, the inventory loader, the role-environment exporter, the launch-record
selector and the engine launcher. The files come from one synthetic discovery and `prepare` run through the
real code paths (`helpers.synthetic_run`: a router with two colocated engines, an RDMA engine, an engine
credential, per-node overrides); role files are read as bash leaves them after sourcing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.files import read_json, source_env
from helpers.fleet_readers import (
    fleet_problems,
    inventory_problems,
    launch_record_problems,
    launcher_problems,
    profiling_limits_problems,
    role_file_problems,
    runtime_problems,
)
from helpers.synthetic_run import ENV, SyntheticRun, synthetic_run

from narwhal_assets.core.discovery.digests import model_tree_digest
from narwhal_assets.host import probe
from narwhal_assets.protocols.probe_report import parse_models

ENGINES = {"engine-1": "node-1", "engine-2": "node-1", "engine-3": "node-3"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> SyntheticRun:
    return synthetic_run(tmp_path_factory.mktemp("contract") / "checkout")


def role_env(run: SyntheticRun, host: str, role: str) -> dict[str, str]:
    return source_env(run.prepared.run_dir / host / f".env.{role}")


def test_the_inventory_is_what_the_host_access_loader_accepts(run: SyntheticRun) -> None:
    document = read_json(run.settings.hosts_path)
    assert inventory_problems(document, ENV) == []
    assert [(h["id"], h["roles"]) for h in document["hosts"]] == [("node-1", ["router", "engine-1", "engine-2"]),
                                                                 ("node-3", ["engine-3"])]  # fmt: skip


def test_the_fleet_is_what_the_router_loads_with_its_role_file(run: SyntheticRun) -> None:
    router = role_env(run, "node-1", "router")
    for fleet in (read_json(run.settings.fleet_path), read_json(run.prepared.run_dir / "node-1" / "fleet.local.json")):
        assert fleet_problems(fleet, router) == []
    assert fleet_problems(read_json(run.settings.fleet_path), {}) != []  # without the role file, nothing resolves


def test_profiling_limits_are_the_launch_records_sequence_limits(run: SyntheticRun) -> None:
    fleet = read_json(run.settings.fleet_path)
    launches = read_json(run.settings.launch_config_path)["engines"]
    iids = {engine["iid"] for engine in fleet["engines"]}
    for path in (run.settings.profiling_limits_path, run.prepared.run_dir / "node-1" / "profiling-limits.json"):
        assert profiling_limits_problems(read_json(path), iids, launches) == []


@pytest.mark.parametrize("role", sorted(ENGINES))
def test_the_launch_record_is_what_the_fleets_selector_accepts(run: SyntheticRun, role: str) -> None:
    document = read_json(run.settings.launch_config_path)
    assert launch_record_problems(document, role, role_env(run, ENGINES[role], role)) == []


@pytest.mark.parametrize("role", sorted(ENGINES))
def test_the_per_engine_file_is_what_the_fleets_launcher_builds_from(run: SyntheticRun, role: str) -> None:
    host = ENGINES[role]
    record = read_json(run.prepared.run_dir / host / f"engine-launch.{role}.json")
    assert launcher_problems(record, role_env(run, host, role)) == []
    local = read_json(run.settings.launch_config_path)["engines"][role]
    assert {key: record[key] for key in local} == local  # the entry itself, unchanged


def test_colocated_engines_see_each_others_gpus_and_rdma_maps_its_devices(run: SyntheticRun) -> None:
    files = {role: read_json(run.prepared.run_dir / host / f"engine-launch.{role}.json")
             for role, host in ENGINES.items()}  # fmt: skip
    assert [files[r]["environment"]["CUDA_VISIBLE_DEVICES"] for r in sorted(files)] == ["0,1,2,3", "2,3,0,1", "0,1"]
    assert files["engine-3"]["transfer"]["devices"] == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]


@pytest.mark.parametrize(("host", "role"), [("node-1", "router"), *((h, r) for r, h in ENGINES.items())])
def test_role_files_are_what_the_fleets_exporter_writes(run: SyntheticRun, host: str, role: str) -> None:
    fleet = read_json(run.settings.fleet_path)
    access = {"NARWHAL_ROUTER_SSH", "NARWHAL_NODE_3_SSH_PASSWORD", *(f"NARWHAL_NODE_{n}_SSH" for n in (1, 2, 3))}
    assert role_file_problems(role_env(run, host, role), role, fleet, [1, 2, 3], access) == []


def test_the_engine_hosts_documented_tool_checks_pass_under_set_u(run: SyntheticRun, tmp_path: Path) -> None:
    """The serving fleet's runbook checks each tool snapshot against its digest variable with `set -u`."""
    host_dir = run.prepared.run_dir / "node-3"
    tools = tmp_path / "runs" / "deployment-tools"
    tools.mkdir(parents=True)
    for tool in ("fabric_budget.py", "launch_engine.py", "cache_capture_hook.py"):
        shutil.copy(host_dir / tool, tools / tool)
    shutil.copy(host_dir / ".env.engine-3", tmp_path / ".env.engine-3")
    script = "\n".join([
        "set -eu", ". ./.env.engine-3",
        'test "$(sha256sum "$NARWHAL_FABRIC_BUDGET_TOOL" | cut -d" " -f1)" = "$NARWHAL_FABRIC_BUDGET_SHA256"',
        'test "$(sha256sum "$NARWHAL_ENGINE_LAUNCHER" | cut -d" " -f1)" = "$NARWHAL_ENGINE_LAUNCHER_SHA256"',
        'test "$(sha256sum "$NARWHAL_CACHE_CAPTURE_HOOK" | cut -d" " -f1)" = "$NARWHAL_CACHE_CAPTURE_HOOK_SHA256"',
    ])  # fmt: skip
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_checkpoint_digests_carry_the_fleets_model_tree_sha256(tmp_path: Path) -> None:
    """The fleet's checkpoint manifest hashes the served files (hub download metadata left out) into
    `model_tree_sha256`; discovery's record of the same tree carries that value."""
    model = tmp_path / "model"
    (model / "tok").mkdir(parents=True)
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "w-00001.safetensors").write_bytes(b"\x01" * 5000)
    (model / "tok" / "t.json").write_text("{}")
    (model / ".cache" / "huggingface" / "w-00001.safetensors.metadata").write_text("etag\n")
    result = dict(probe.hash_tree(str(model)), model_dir=str(model), ok=True)
    _, digests, problems = parse_models("node-1", {"engine-1": result}, False, {})
    assert problems == []
    digest = digests["engine-1"]
    fleet_rows = []
    for path in sorted(model.rglob("*")):
        relative = path.relative_to(model)
        if path.is_file() and relative.parts[:2] != (".cache", "huggingface"):
            fleet_rows.append({"path": relative.as_posix(), "size": path.stat().st_size,
                               "sha256": next(f.sha256 for f in digest.files if f.path == relative.as_posix())})
    assert len(fleet_rows) == len(digest.files) == 3
    expected = hashlib.sha256(json.dumps(fleet_rows, sort_keys=True, separators=(",", ":")).encode())
    assert digest.model_tree_sha256 == expected.hexdigest() == model_tree_digest(digest.files)


# --- the rules can fail: the previous format breaks each of them ------------------------------------------------

PREVIOUS_ENTRY = {
    "host_id": "node-1", "accelerator": "NVIDIA H200", "gpu_ids": [0, 1], "tensor_parallel_size": 2,
    "gpu_visibility_env": "CUDA_VISIBLE_DEVICES", "accelerator_devices": ["/dev/nvidia0", "/dev/nvidiactl"],
    "network_mode": "host", "fabric_address": "198.18.0.1",
    "transfer": {"transport": "ucx_tcp", "net_devices": "eth1", "devices": ["eth1"], "gpu_tls": ["cuda_copy"]},
    "sources": {"gpu_ids": {"layer": "discovered"}},
    "runtime": {"expected_packages": ["vllm", "nixl"], "model_dtype": "auto", "kv_cache_dtype": "auto",
                "block_size": 128, "environment": {"CUDA_VISIBLE_DEVICES": "0,1", "UCX_TLS": "tcp,cuda_copy"},
                "extra_args": ["--seed", "7"]},
}  # fmt: skip


def test_a_launch_record_of_the_previous_format_breaks_the_rules_it_was_refused_for() -> None:
    document = {"schema": "narwhal.engine-launch", "schema_version": 1, "engines": {"engine-1": PREVIOUS_ENTRY}}
    found = launch_record_problems(document, "engine-1", {"NARWHAL_FABRIC_INTERFACE": "eth1"})
    assert found == [
        "gpu_ids are not distinct index or UUID strings",
        "tensor_parallel_size does not fit the allocation",
        "transfer.gpu_tls is not one GPU transport of the runtime",
        "transfer.devices are not device paths under /dev",
        "sources do not name the allocation, devices and transfer",
        "runtime.expected_packages does not pin vllm and nixl",
    ]
    runtime = {**PREVIOUS_ENTRY["runtime"], "expected_packages": {"vllm": "0.11.0", "nixl": "0.6.1"}}
    assert runtime_problems(runtime) == [
        "runtime dtypes are not a two-byte model dtype with kv_cache_dtype auto",
        "runtime.extra_args: --seed is not an option the launcher accepts",
        "runtime.extra_args: 7 is not an option the launcher accepts",
        "runtime.environment: CUDA_VISIBLE_DEVICES is not a field the launcher accepts",
        "runtime.environment: UCX_TLS is not a field the launcher accepts",
    ]
    previous_file = {"schema": "narwhal.engine-launch.engine", "schema_version": 1, "engine": "engine-1",
                     "role": "prefill", **PREVIOUS_ENTRY}  # fmt: skip
    assert launcher_problems(previous_file, {}) == ["role is not an engine role"]
    assert launcher_problems({**previous_file, "role": "engine-1"}, {})[0] == (
        "schema is not narwhal.engine-launch version 1")

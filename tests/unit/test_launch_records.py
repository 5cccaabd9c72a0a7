"""Launch policy and launch records: defaults, layers, per-node overrides, placement and every validation rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.launch_inputs import IMAGE_ID, PACKAGES, colocated, gpu, make_settings, observation, rdma_port, two_hosts

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.launch_records import (
    EngineLaunchConfig,
    EngineLaunchFile,
    LaunchRecords,
    build_launch_records,
    engine_launch_file,
    resolve_engine_field,
)
from narwhal_assets.core.launch.policy import FIELDS, REQUIRED_FIELDS, SourceLayer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "launch-policy.md"
NIXL = ('{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail",'
        '"kv_connector_extra_config":{"backends":["UCX"],"enforce_handshake_compat":true}}')


def records(settings=None, hosts=None, **kwargs) -> LaunchRecords:
    inventory, observations = hosts or two_hosts()
    return build_launch_records(settings or make_settings(), inventory, observations, **kwargs)


def build(settings=None, hosts=None, **kwargs) -> EngineLaunchConfig:
    return records(settings, hosts, **kwargs).config


def environment(config: EngineLaunchConfig, n: int) -> dict[str, str]:
    """What the launcher sets for engine n: the per-engine file's `environment`."""
    return engine_launch_file(config, n, "decode").environment


def problems_of(settings=None, hosts=None, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        build(settings, hosts, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------------------------------------- defaults


def test_defaults_generate_the_documented_command_line() -> None:
    entry = build().engines["engine-1"]
    assert entry.args == [
        "/models/llama",
        "--served-model-name", "llama-3.1-8b",
        "--tensor-parallel-size", "2",
        "--dtype", "bfloat16",
        "--kv-cache-dtype", "auto",
        "--block-size", "128",
        "--port", "8000",
        "--no-enable-prefix-caching",
        "--kv-transfer-config", NIXL,
        "--max-model-len", "16384",
        "--max-num-seqs", "8",
        "--gpu-memory-utilization", "0.9",
        "--enforce-eager",
    ]
    assert entry.runtime.extra_args == entry.args[-7:]  # where the fleet's launcher and profiler read them
    assert json.loads(NIXL)["kv_connector_extra_config"]["enforce_handshake_compat"] is True


def test_defaults_place_the_engine_on_every_observed_gpu_over_tcp() -> None:
    entry = build().engines["engine-2"]
    assert entry.host_id == "node-2"
    assert entry.accelerator == "NVIDIA H100 80GB HBM3"
    assert entry.gpu_ids == ["0", "1"]
    assert entry.tensor_parallel_size == 2
    assert entry.gpu_visibility_env == "CUDA_VISIBLE_DEVICES"
    assert entry.accelerator_devices == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert entry.network_mode == "host"
    assert entry.fabric_address == "198.18.0.2"
    assert entry.transfer.model_dump() == {"transport": "ucx_tcp", "net_devices": "eth1", "devices": [],
                                           "gpu_tls": "cuda"}
    assert entry.runtime.environment == {}  # nothing the launcher manages itself
    assert environment(build(), 2) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "UCX_TLS": "tcp,sm,self,cuda",
        "UCX_NET_DEVICES": "eth1",
        "UCX_TCP_PORT_RANGE": "50000-50999",
        "NIXL_HOST_IP": "198.18.0.2",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "198.18.0.2",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
    }
    assert entry.runtime.block_size == 128
    assert entry.runtime.kv_cache_dtype == "auto"
    assert entry.runtime.model_dtype == "bfloat16"
    assert entry.runtime.expected_packages == PACKAGES
    assert entry.sources.allocation.startswith("node-2.json") and entry.sources.transfer
    assert entry.ports.model_dump() == {"engine": 8000, "attestation": 8001, "nixl_side_channel": 5600,
                                        "nixl_side_channel_window": (5600, 5602), "ucx_tcp_port_range": "50000-50999"}


def test_default_sources_name_the_default_layer_and_the_observation_file() -> None:
    index = records(observation_dir="runs/discovery/r1").sources

    def sources(field: str):
        return index.source("engine-1", field)

    assert sources("max_num_seqs").layer is SourceLayer.DEFAULT
    assert sources("max_num_seqs").variable is None
    assert sources("engine_model_name").layer is SourceLayer.DOTENV
    assert sources("engine_model_name").variable == "NARWHAL_ENGINE_MODEL_NAME"
    assert sources("gpu_ids").layer is SourceLayer.DISCOVERED
    assert sources("gpu_ids").observation == "runs/discovery/r1/node-1.json"
    assert sources("fabric_address").observation == "runs/discovery/r1/node-1.json"
    assert sources("fabric_address").variable == "NARWHAL_FABRIC_INTERFACE"
    assert sources("tensor_parallel_size").detail == "number of allocated GPUs"
    assert {f.key for f in FIELDS} <= set(index.shared) | set(index.engines["engine-1"])
    assert build(observation_dir="runs/discovery/r1").engines["engine-1"].sources.devices.startswith(
        "runs/discovery/r1/node-1.json")


def test_max_model_len_default_is_capped_by_the_model_but_an_explicit_excess_is_refused() -> None:
    configs = {1: {"max_position_embeddings": 8192, "torch_dtype": "bfloat16"}, 2: {}}
    config = build(model_configs=configs)
    assert "--max-model-len" in config.engines["engine-1"].args
    args = config.engines["engine-1"].args
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert config.engines["engine-1"].runtime.model_dtype == "bfloat16"
    assert config.engines["engine-2"].args[config.engines["engine-2"].args.index("--max-model-len") + 1] == "16384"
    assert "capped" in (records(model_configs=configs).sources.source("engine-1", "max_model_len").detail or "")
    message = problems_of(make_settings({"NARWHAL_MAX_MODEL_LEN": "32768"}), model_configs=configs)
    assert "engine-1: NARWHAL_MAX_MODEL_LEN exceeds the model's max_position_embeddings (8192)" in message


# --------------------------------------------------------------------------------- layers and overrides


def test_dotenv_fleet_value_and_process_node_override_are_recorded_by_layer() -> None:
    settings = make_settings(
        dotenv={"NARWHAL_MAX_NUM_SEQS": "16", "NARWHAL_GPU_MEMORY_UTILIZATION": "0.8"},
        process={"NARWHAL_NODE_2_MAX_NUM_SEQS": "4", "NARWHAL_GPU_MEMORY_UTILIZATION": "0.85"},
        discovered={"NARWHAL_NODE_1_ENGINE_IMAGE": "sha256:" + "b" * 64, "NARWHAL_MAX_NUM_SEQS": "2"},
    )
    config = build(settings)
    one, two = config.engines["engine-1"], config.engines["engine-2"]
    assert one.args[one.args.index("--max-num-seqs") + 1] == "16"
    assert two.args[two.args.index("--max-num-seqs") + 1] == "4"
    assert one.args[one.args.index("--gpu-memory-utilization") + 1] == "0.85"
    index = records(settings).sources
    assert index.source("engine-1", "max_num_seqs").layer is SourceLayer.DOTENV
    assert index.source("engine-1", "max_num_seqs").variable == "NARWHAL_MAX_NUM_SEQS"
    assert index.source("engine-2", "max_num_seqs").layer is SourceLayer.NODE_OVERRIDE
    assert index.source("engine-2", "max_num_seqs").variable == "NARWHAL_NODE_2_MAX_NUM_SEQS"
    assert index.source("engine-1", "gpu_memory_utilization").layer is SourceLayer.PROCESS
    assert index.source("engine-1", "engine_image").layer is SourceLayer.DISCOVERED
    assert index.source("engine-1", "engine_image").variable == "NARWHAL_NODE_1_ENGINE_IMAGE"
    assert index.source("engine-2", "engine_image").layer is SourceLayer.DOTENV
    assert "gpu_memory_utilization" in index.shared and "max_num_seqs" not in index.shared


def test_node_override_wins_over_a_fleet_value_from_a_higher_layer() -> None:
    """Discovery's per-node image pin survives a fleet-wide tag in .env (and vice versa a .env node value)."""
    settings = make_settings(
        dotenv={"NARWHAL_ENGINE_IMAGE": "vllm/vllm-openai:v0.10"},
        discovered={"NARWHAL_NODE_1_ENGINE_IMAGE": IMAGE_ID, "NARWHAL_NODE_2_ENGINE_IMAGE": IMAGE_ID},
    )
    resolved = resolve_engine_field(settings, 1, "NARWHAL_ENGINE_IMAGE")
    assert (resolved.value, resolved.layer, resolved.variable) == (IMAGE_ID, SourceLayer.DISCOVERED,
                                                                   "NARWHAL_NODE_1_ENGINE_IMAGE")
    assert records(settings).sources.source("engine-1", "engine_image").layer is SourceLayer.DISCOVERED
    same_name = resolve_engine_field(make_settings({"NARWHAL_NODE_1_ENGINE_PORT": "9000"},
                                                   discovered={"NARWHAL_NODE_1_ENGINE_PORT": "7000"}), 1, "ENGINE_PORT")
    assert (same_name.value, same_name.layer) == ("9000", SourceLayer.NODE_OVERRIDE)


def test_resolve_engine_field_default_layer_and_unknown_field() -> None:
    resolved = resolve_engine_field(make_settings(), 3, "ENGINE_PORT")
    assert (resolved.value, resolved.layer, resolved.variable) == ("8000", SourceLayer.DEFAULT, None)
    assert resolved.name == "NARWHAL_ENGINE_PORT"
    with pytest.raises(KeyError):
        resolve_engine_field(make_settings(), 1, "NARWHAL_NOT_A_FIELD")


def test_the_ten_required_fields_are_the_spec_list() -> None:
    assert [f.variable for f in REQUIRED_FIELDS] == [
        "NARWHAL_ENGINE_IMAGE", "NARWHAL_ENGINE_MODEL_NAME", "NARWHAL_MODEL_DIR", "NARWHAL_RUN_DIR",
        "NARWHAL_MODEL_CONFIG_SHA256", "NARWHAL_FABRIC_INTERFACE", "NARWHAL_ENGINE_PORT", "NARWHAL_ATTEST_PORT",
        "NARWHAL_NIXL_SIDE_CHANNEL_PORT", "NARWHAL_UCX_TCP_PORT_RANGE",
    ]


@pytest.mark.parametrize("field", [f.name for f in REQUIRED_FIELDS])
def test_an_empty_override_of_a_required_field_is_an_error_against_that_field(field: str) -> None:
    settings = make_settings({f"NARWHAL_NODE_2_{field}": ""})
    with pytest.raises(InputError) as info:
        resolve_engine_field(settings, 2, field)
    assert f"NARWHAL_NODE_2_{field} is set but empty; NARWHAL_{field} is required" in str(info.value)
    assert f"NARWHAL_NODE_2_{field}" in problems_of(settings)


def test_an_empty_override_of_an_optional_field_is_a_value() -> None:
    settings = make_settings({"NARWHAL_EXTRA_ENGINE_ARGS": "--max-num-batched-tokens 4096",
                              "NARWHAL_NODE_2_EXTRA_ENGINE_ARGS": ""})  # fmt: skip
    config = build(settings)
    assert config.engines["engine-1"].args[-2:] == ["--max-num-batched-tokens", "4096"]
    assert config.engines["engine-2"].args[-1] == "--enforce-eager"


def test_missing_required_fields_are_all_reported_by_variable() -> None:
    message = problems_of(make_settings(base={"NARWHAL_ENGINE_IMAGE": IMAGE_ID}))
    for name in ("NARWHAL_ENGINE_MODEL_NAME", "NARWHAL_MODEL_DIR", "NARWHAL_RUN_DIR", "NARWHAL_MODEL_CONFIG_SHA256",
                 "NARWHAL_FABRIC_INTERFACE"):
        assert f"engine-1: {name} is unset; it is required" in message
        assert f"engine-2: {name} is unset" in message


# ---------------------------------------------------------------------------------------- GPU placement


def test_colocated_engines_without_explicit_allocations_name_the_variables_to_set() -> None:
    message = problems_of(hosts=colocated())
    assert "host node-1: engine-1 shares the host with another engine; set NARWHAL_NODE_1_GPU_IDS" in message
    assert "set NARWHAL_NODE_2_GPU_IDS" in message
    assert "NARWHAL_NODE_3_GPU_IDS" not in message
    fleet_wide = problems_of(make_settings({"NARWHAL_GPU_IDS": "0,1"}), hosts=colocated())
    assert "set NARWHAL_NODE_1_GPU_IDS" in fleet_wide


COLOCATED_OK = {
    "NARWHAL_NODE_1_GPU_IDS": "0,1",
    "NARWHAL_NODE_2_GPU_IDS": "GPU-00000002-aaaa-bbbb-cccc-000000000000,3",
    "NARWHAL_NODE_2_ENGINE_PORT": "8100",
    "NARWHAL_NODE_2_ATTEST_PORT": "8101",
    "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5700",
    "NARWHAL_NODE_2_UCX_TCP_PORT_RANGE": "51000-51999",
}


def test_colocated_engines_with_disjoint_allocations_and_ports() -> None:
    built = records(make_settings(COLOCATED_OK), hosts=colocated())
    config = built.config
    one, two = config.engines["engine-1"], config.engines["engine-2"]
    assert one.gpu_ids == ["0", "1"]
    assert two.gpu_ids == ["2", "3"]  # a UUID is recorded as its index: vLLM reads CUDA_VISIBLE_DEVICES as integers
    assert two.accelerator_devices[:2] == ["/dev/nvidia2", "/dev/nvidia3"]
    assert built.sources.source("engine-2", "gpu_ids").layer is SourceLayer.NODE_OVERRIDE
    assert config.engines["engine-3"].gpu_ids == ["0", "1"]


def test_colocated_engines_see_their_own_gpus_first_then_their_peers() -> None:
    """The serving fleet's visibility order: CUDA IPC between engines on one host needs the peers' GPUs."""
    config = build(make_settings(COLOCATED_OK), hosts=colocated())
    visible = {n: environment(config, n)["CUDA_VISIBLE_DEVICES"] for n in (1, 2, 3)}
    assert visible == {1: "0,1,2,3", 2: "2,3,0,1", 3: "0,1"}
    assert engine_launch_file(config, 2, "decode").vllm_args == ["--tensor-parallel-size", "2"]


def test_colocated_engines_sharing_a_gpu_are_refused() -> None:
    settings = make_settings({**COLOCATED_OK, "NARWHAL_NODE_2_GPU_IDS": "1,2"})
    assert ("host node-1: engine-1 (NARWHAL_NODE_1_GPU_IDS) and engine-2 (NARWHAL_NODE_2_GPU_IDS) share GPU "
            "index 1") in problems_of(settings, hosts=colocated())


def test_colocated_engines_with_default_ports_overlap() -> None:
    settings = make_settings({"NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_NODE_2_GPU_IDS": "2,3"})
    message = problems_of(settings, hosts=colocated())
    assert "host node-1: engine-1 NARWHAL_ENGINE_PORT (8000) overlaps engine-2 NARWHAL_ENGINE_PORT (8000)" in message
    assert "engine-1 NARWHAL_UCX_TCP_PORT_RANGE (50000-50999) overlaps engine-2" in message
    assert "NIXL_SIDE_CHANNEL_PORT (5600-5602)" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("7", "engine-1: NARWHAL_GPU_IDS names GPUs not observed on host node-1: 7 (observed indices: 0, 1)"),
        ("GPU-nope", "names GPUs not observed on host node-1: GPU-nope"),
        ("0,0", "engine-1: NARWHAL_GPU_IDS names the same GPU twice"),
        ("0,,1", "engine-1: NARWHAL_GPU_IDS must be a comma-separated list of GPU indices or UUIDs"),
    ],
)
def test_gpu_ids_are_validated_against_the_observed_gpus(value: str, expected: str) -> None:
    assert expected in problems_of(make_settings({"NARWHAL_GPU_IDS": value}))


def test_tensor_parallel_defaults_to_the_allocation_and_is_bounded_by_it() -> None:
    config = build(make_settings({"NARWHAL_GPU_IDS": "1", "NARWHAL_NODE_2_TENSOR_PARALLEL_SIZE": "1"}))
    assert config.engines["engine-1"].tensor_parallel_size == 1
    assert environment(config, 1)["CUDA_VISIBLE_DEVICES"] == "1"  # the host's index: every GPU is mapped
    assert config.engines["engine-1"].accelerator_devices[0] == "/dev/nvidia1"
    message = problems_of(make_settings({"NARWHAL_NODE_2_TENSOR_PARALLEL_SIZE": "4"}))
    assert "engine-2: NARWHAL_NODE_2_TENSOR_PARALLEL_SIZE must be 1..2 (GPUs allocated by NARWHAL_GPU_IDS)" in message


def test_mixed_gpu_products_in_one_engine_are_refused() -> None:
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"], gpus=[gpu(0), gpu(1, "NVIDIA A100")])
    assert "engine-1: allocated GPUs mix products" in problems_of(hosts=(inventory, observations))


def test_hosts_without_gpus_or_observation_are_reported() -> None:
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"], gpus=0)
    del observations["node-2"]
    message = problems_of(hosts=(inventory, observations))
    assert "host node-1: no GPUs observed for engine-1" in message
    assert "host node-2: no observation for engine-2 (run discovery)" in message


# ------------------------------------------------------------------------------------------ UCX selection


def test_rdma_transport_maps_the_active_ports_verbs_devices() -> None:
    """Without its /dev/infiniband character devices an RDMA engine container has no verbs device."""
    hosts = two_hosts(rdma=[rdma_port("1: DOWN", ["eth2"], device="mlx5_1", verbs=["uverbs1"]), rdma_port()],
                      rdma_devices=["rdma_cm", "uverbs0", "uverbs1"])  # fmt: skip
    config = build(make_settings({"NARWHAL_TRANSFER_TRANSPORT": "ucx_rdma"}), hosts)
    entry = config.engines["engine-1"]
    assert entry.transfer.transport == "ucx_rdma"
    assert entry.transfer.net_devices == "mlx5_0:1"
    assert entry.transfer.devices == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]
    assert environment(config, 1)["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert environment(config, 1)["UCX_TLS"] == "rc,sm,self,cuda"


def test_rdma_without_the_verbs_character_device_is_refused_naming_the_transport() -> None:
    message = problems_of(make_settings({"NARWHAL_NODE_2_TRANSFER_TRANSPORT": "ucx_rdma"}),
                          hosts=two_hosts(rdma=[rdma_port()], rdma_devices=["rdma_cm"]))  # fmt: skip
    assert ("host node-2: engine-2 NARWHAL_NODE_2_TRANSFER_TRANSPORT is ucx_rdma but mlx5_0 has no verbs "
            "character device under /dev/infiniband") in message


def test_tcp_policy_stays_on_tcp_even_with_an_active_rdma_port() -> None:
    config = build(hosts=two_hosts(rdma=[rdma_port()]))
    assert environment(config, 1)["UCX_NET_DEVICES"] == "eth1"
    assert environment(config, 1)["UCX_TLS"].startswith("tcp,")
    assert config.engines["engine-1"].transfer.devices == []


def test_rdma_policy_without_an_active_port_is_an_error() -> None:
    message = problems_of(make_settings({"NARWHAL_NODE_2_TRANSFER_TRANSPORT": "ucx_rdma"}),
                          hosts=two_hosts(rdma=[rdma_port("1: DOWN")]))
    assert ("host node-2: engine-2 NARWHAL_NODE_2_TRANSFER_TRANSPORT is ucx_rdma but no ACTIVE RDMA port was "
            "observed") in message
    assert "engine-1" not in message


def test_fabric_interface_missing_or_without_address_names_host_and_interface() -> None:
    message = problems_of(make_settings({"NARWHAL_NODE_2_FABRIC_INTERFACE": "ib0"}))
    assert "host node-2: fabric interface 'ib0' (NARWHAL_NODE_2_FABRIC_INTERFACE) not found" in message
    assert "(observed interfaces: lo, eth1)" in message
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"], addresses=[])
    assert ("host node-1: fabric interface 'eth1' (NARWHAL_FABRIC_INTERFACE) has no global IPv4 or IPv6 address"
            in problems_of(hosts=(inventory, observations)))


# -------------------------------------------------------------------------------------- validation rules


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"NARWHAL_ENGINE_PORT": "0"}, "engine-1: NARWHAL_ENGINE_PORT must be a port number in 1..65535"),
        ({"NARWHAL_NODE_2_ATTEST_PORT": "65536"}, "engine-2: NARWHAL_NODE_2_ATTEST_PORT must be a port number"),
        ({"NARWHAL_NIXL_SIDE_CHANNEL_PORT": "http"}, "NARWHAL_NIXL_SIDE_CHANNEL_PORT must be a port number"),
        ({"NARWHAL_UCX_TCP_PORT_RANGE": "50000"}, "NARWHAL_UCX_TCP_PORT_RANGE must be 'A-B' with 1 <= A <= B"),
        ({"NARWHAL_UCX_TCP_PORT_RANGE": "6000-5000"}, "NARWHAL_UCX_TCP_PORT_RANGE must be 'A-B'"),
        ({"NARWHAL_UCX_TCP_PORT_RANGE": "0-10"}, "NARWHAL_UCX_TCP_PORT_RANGE must be 'A-B'"),
        ({"NARWHAL_UCX_TCP_PORT_RANGE": "40000-42049"}, "spans 2050 ports; at most 2049 are allowed"),
        ({"NARWHAL_NIXL_SIDE_CHANNEL_PORT": "65535"}, "NARWHAL_NIXL_SIDE_CHANNEL_PORT plus its per-rank window ends "
                                                      "above port 65535"),
        ({"NARWHAL_ATTEST_PORT": "8000"}, "host node-1: engine-1 NARWHAL_ATTEST_PORT (8000) overlaps engine-1 "
                                          "NARWHAL_ENGINE_PORT (8000)"),
        ({"NARWHAL_NIXL_SIDE_CHANNEL_PORT": "49999"}, "NARWHAL_NIXL_SIDE_CHANNEL_PORT (49999-50001) overlaps "
                                                      "engine-1 NARWHAL_UCX_TCP_PORT_RANGE (50000-50999)"),
        ({"NARWHAL_ENGINE_IMAGE": "vllm/vllm-openai:v0.10"}, "engine-1: NARWHAL_ENGINE_IMAGE is not pinned"),
        ({"NARWHAL_ENGINE_IMAGE": "sha256:abc"}, "NARWHAL_ENGINE_IMAGE is not pinned"),
        ({"NARWHAL_MODEL_CONFIG_SHA256": "XYZ"}, "NARWHAL_MODEL_CONFIG_SHA256 must be 64 lower-case hex digits"),
        ({"NARWHAL_MODEL_DIR": "models/llama"}, "NARWHAL_MODEL_DIR must be an absolute path"),
        ({"NARWHAL_FABRIC_INTERFACE": "eth 1"}, "NARWHAL_FABRIC_INTERFACE must be a network interface name"),
        ({"NARWHAL_MAX_NUM_SEQS": "0"}, "engine-1: NARWHAL_MAX_NUM_SEQS must be an integer in 1..65536"),
        ({"NARWHAL_MAX_MODEL_LEN": "lots"}, "NARWHAL_MAX_MODEL_LEN must be an integer"),
        ({"NARWHAL_GPU_MEMORY_UTILIZATION": "1.5"}, "NARWHAL_GPU_MEMORY_UTILIZATION must be a number in (0, 1]"),
        ({"NARWHAL_KV_BLOCK_SIZE": "100"}, "NARWHAL_KV_BLOCK_SIZE must be one of 8, 16, 32, 64, 128, 256"),
        ({"NARWHAL_KV_CACHE_DTYPE": "fp8"}, "NARWHAL_KV_CACHE_DTYPE must be one of auto"),
        ({"NARWHAL_MODEL_DTYPE": "float32"}, "NARWHAL_MODEL_DTYPE must be one of bfloat16, float16"),
        ({"NARWHAL_ENFORCE_EAGER": "yes"}, "NARWHAL_ENFORCE_EAGER must be one of 0, 1"),
        ({"NARWHAL_TRANSFER_TRANSPORT": "tcp"}, "NARWHAL_TRANSFER_TRANSPORT must be one of ucx_tcp, ucx_rdma"),
        ({"NARWHAL_UCX_GPU_TLS": "cuda_copy,cuda_ipc"}, "NARWHAL_UCX_GPU_TLS must be one of cuda, cuda_copy"),
        ({"NARWHAL_TENSOR_PARALLEL_SIZE": ""}, "NARWHAL_TENSOR_PARALLEL_SIZE must be an integer in 1..64"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--max-num-seqs 64"}, "flag --max-num-seqs is set by the launch policy; set "
                                                             "NARWHAL_MAX_NUM_SEQS instead"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--enforce-eager"}, "set NARWHAL_ENFORCE_EAGER instead"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--port=9000"}, "flag --port is not allowed (the serving fleet's launcher "
                                                       "accepts --async-scheduling"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--api-key abc"}, "flag --api-key is not allowed"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--seed 7"}, "flag --seed is not allowed"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--enable-prefix-caching"}, "flag --enable-prefix-caching is not allowed"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "7 --trust-remote-code"}, "NARWHAL_EXTRA_ENGINE_ARGS: '7' follows no option"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--trust-remote-code yes"}, "'yes' follows no option that takes a value"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--reasoning-parser --trust-remote-code"}, "--reasoning-parser needs a value"),
        ({"NARWHAL_EXTRA_ENGINE_ARGS": "--seed '7"}, "NARWHAL_EXTRA_ENGINE_ARGS is not valid shell-quoted words"),
        ({"NARWHAL_ENGINE_ENV": "HF_TOKEN=hf_sentinel"}, "HF_TOKEN looks like a credential"),
        ({"NARWHAL_ENGINE_ENV": "VLLM_API_KEY=sentinel"}, "VLLM_API_KEY looks like a credential"),
        ({"NARWHAL_ENGINE_ENV": "VLLM_NIXL_SKIP_COMPATIBILITY_CHECK=1"}, "VLLM_NIXL_SKIP_COMPATIBILITY_CHECK turns "
                                                                          "off NIXL's compatibility check"),
        ({"NARWHAL_ENGINE_ENV": "LD_PRELOAD=/tmp/x.so"}, "LD_PRELOAD is not allow-listed"),
        ({"NARWHAL_ENGINE_ENV": "NCCL_DEBUG=INFO"}, "NCCL_DEBUG is not allow-listed"),
        ({"NARWHAL_ENGINE_ENV": "HF_HUB_OFFLINE=1"}, "HF_HUB_OFFLINE is not allow-listed"),
        ({"NARWHAL_ENGINE_ENV": "PYTHONPATH=/x"}, "PYTHONPATH is set by the launcher"),
        ({"NARWHAL_ENGINE_ENV": "UCX_TLS=all"}, "UCX_TLS is set by the launcher from the launch record"),
        ({"NARWHAL_ENGINE_ENV": "NIXL_HOST_IP=10.0.0.9"}, "NIXL_HOST_IP is set by the launcher"),
        ({"NARWHAL_ENGINE_ENV": "lower=1"}, "lower is not an upper-case variable name"),
        ({"NARWHAL_ENGINE_ENV": "JUSTAWORD"}, "a word is not NAME=value"),
    ],
)
def test_validation_rule(overrides: dict[str, str], expected: str) -> None:
    message = problems_of(make_settings(overrides))
    assert expected in message
    for value in overrides.values():
        if "sentinel" in value:
            assert "sentinel" not in message


def test_allowed_extras_reach_args_and_environment() -> None:
    settings = make_settings({
        "NARWHAL_EXTRA_ENGINE_ARGS": "--max-num-batched-tokens=8192 --trust-remote-code --attention-backend FLASHINFER",
        "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG 'PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True'",
        "NARWHAL_ENFORCE_EAGER": "0",
        "NARWHAL_MODEL_DTYPE": "float16",
        "NARWHAL_ENGINE_IMAGE": "registry.example.com/narwhal/engine@sha256:" + "d" * 64,
    })
    entry = build(settings).engines["engine-1"]
    extras = ["--max-num-batched-tokens", "8192", "--trust-remote-code", "--attention-backend", "FLASHINFER"]
    assert entry.runtime.extra_args == ["--max-model-len", "16384", "--max-num-seqs", "8",
                                        "--gpu-memory-utilization", "0.9", *extras]  # `--flag=value` split in two
    assert entry.args[entry.args.index("--kv-transfer-config") + 2:] == entry.runtime.extra_args
    assert "--enforce-eager" not in entry.args
    assert entry.args[entry.args.index("--dtype") + 1] == entry.runtime.model_dtype == "float16"
    assert entry.runtime.environment == {"VLLM_LOGGING_LEVEL": "DEBUG",
                                         "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_expected_packages_are_the_images_pinned_versions() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], ip="198.18.0.2", packages={"vllm": "0.11.0"})
    assert ("host node-2: engine-2 image has no nixl package (read with importlib.metadata inside it); the serving "
            "fleet's launcher pins the vllm and nixl versions") in problems_of(hosts=(inventory, observations))
    rocm = {"vllm": "0.11.0", "nixl-rocm": "0.6.1", "flash-attn": "2.8"}
    observations["node-2"] = observation("node-2", ["engine-2"], ip="198.18.0.2", packages=rocm)
    assert build(hosts=(inventory, observations)).engines["engine-2"].runtime.expected_packages == {
        "nixl-rocm": "0.6.1", "vllm": "0.11.0"}


def test_a_four_byte_model_dtype_needs_the_variable() -> None:
    configs = {1: {"torch_dtype": "float32"}, 2: {"text_config": {"dtype": "float16"}}}
    assert ("engine-1: the model config's dtype 'float32' is not bfloat16 or float16, the dtypes the serving "
            "fleet's launcher runs; set NARWHAL_MODEL_DTYPE") in problems_of(model_configs=configs)
    config = build(make_settings({"NARWHAL_NODE_1_MODEL_DTYPE": "bfloat16"}), model_configs=configs)
    assert [config.engines[e].runtime.model_dtype for e in ("engine-1", "engine-2")] == ["bfloat16", "float16"]


def test_ipv6_only_fabric_interface() -> None:
    hosts = two_hosts(addresses=[("inet6", "fe80::1"), ("inet6", "2001:db8::5")])
    inventory, observations = hosts
    observations["node-1"] = observation("node-1", ["router", "engine-1"],
                                         addresses=[("inet6", "2001:db8::1")])
    config = build(hosts=(inventory, observations))
    assert config.engines["engine-1"].fabric_address == "2001:db8::1"
    assert environment(config, 1)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "2001:db8::1"


def test_a_fabric_interface_with_two_global_addresses_needs_the_node_ip() -> None:
    """Taking the first would advertise an address the operator never chose; the selection must be observed."""
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], addresses=[("inet", "198.18.0.2"),
                                                                            ("inet", "198.18.9.2")])  # fmt: skip
    hosts = (inventory, observations)
    assert ("host node-2: fabric interface 'eth1' (NARWHAL_FABRIC_INTERFACE) has 2 global addresses (198.18.0.2, "
            "198.18.9.2); set NARWHAL_NODE_2_IP to the one NIXL should use") in problems_of(hosts=hosts)
    chosen = build(make_settings({"NARWHAL_NODE_2_IP": "198.18.9.2"}), hosts=hosts)
    assert chosen.engines["engine-2"].fabric_address == "198.18.9.2"
    assert ("NARWHAL_NODE_2_IP is not a global address of host node-2's fabric interface 'eth1' (observed: "
            "198.18.0.2, 198.18.9.2)") in problems_of(make_settings({"NARWHAL_NODE_2_IP": "203.0.113.77"}), hosts)


# ----------------------------------------------------------------------------------------------- files


def test_engine_launch_file_and_json_roundtrip() -> None:
    config = build()
    text = render_json(config)
    data = json.loads(text)
    assert data["schema"] == "narwhal.engine-launch" and data["schema_version"] == 1
    assert EngineLaunchConfig.model_validate(data) == config
    per_engine = engine_launch_file(config, 2, "decode")
    dumped = json.loads(render_json(per_engine))
    assert (dumped["schema"], dumped["schema_version"]) == ("narwhal.engine-launch", 1)
    assert (dumped["role"], dumped["iid"], dumped["serving_role"]) == ("engine-2", "n2", "decode")
    assert dumped["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert dumped["args"] == config.engines["engine-2"].args
    assert {k: v for k, v in dumped.items() if k in data["engines"]["engine-2"]} == data["engines"]["engine-2"]
    assert EngineLaunchFile.model_validate(dumped) == per_engine
    with pytest.raises(InputError, match="no record for engine-9"):
        engine_launch_file(config, 9, "decode")


def test_sources_file_shape() -> None:
    data = json.loads(render_json(records().sources))
    assert data["schema"] == "narwhal.engine-launch-sources"
    assert data["schema_version"] == 2
    assert data["shared"]["max_num_seqs"] == {"layer": "default"}  # the same for every engine: once
    assert data["shared"]["engine_port"] == {"layer": "default"}
    assert data["shared"]["engine_image"] == {"layer": "dotenv", "variable": "NARWHAL_ENGINE_IMAGE"}
    assert data["engines"]["engine-1"]["gpu_ids"]["observation"] == "node-1.json"  # differs per engine
    assert "max_num_seqs" not in data["engines"]["engine-1"]


def test_docs_list_every_variable_and_default() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for field in FIELDS:
        assert f"`{field.variable}`" in text, field.variable
        if field.default:
            assert f"`{field.default}`" in text, field.default
    for extra in ("NARWHAL_NODE_<n>_ROLE", "NARWHAL_ENGINE_API_KEY_ENV", "NARWHAL_MACHINE_ID"):
        assert extra in text

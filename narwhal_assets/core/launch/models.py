"""Pydantic models of the launch files: `config/engine-launch.local.json`, its source index, and the
per-engine `config/engine-launch.engine-<n>.json` shipped to each engine host.

Both launch files are read by the serving fleet's launcher, so their shape is its contract (docs/launch-policy.md,
"Launch records"): schema `narwhal.engine-launch` version 1, `gpu_ids` as strings, one `transfer.gpu_tls`,
`transfer.devices` as `/dev` character devices, `sources` naming the allocation, devices and transfer,
`runtime.expected_packages` pinned to the image's versions and no launcher-managed variable in
`runtime.environment`. What this project adds (`host_id`, `fabric_address`, `ports`, `args`, and in the
per-engine file `iid`, `serving_role`) are extra fields the fleet's reader passes through.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from narwhal_assets.core.launch.placement import Transfer
from narwhal_assets.core.launch.policy import Source
from narwhal_assets.core.records import Record

ServingRole = Literal["prefill", "decode"]
ModelDtype = Literal["bfloat16", "float16"]
KvCacheDtype = Literal["auto"]
LAUNCH_SCHEMA: Final = "narwhal.engine-launch"


class Ports(Record):
    engine: int
    attestation: int
    nixl_side_channel: int
    nixl_side_channel_window: tuple[int, int]
    ucx_tcp_port_range: str


class Runtime(Record):
    """What the launcher checks inside the image and passes to the engine: pinned package versions, the
    two-byte model dtype, `auto` KV cache, the block size, operator environment and the policy's engine flags
    (the fleet's profiler reads `--max-num-seqs` from `extra_args`)."""

    expected_packages: dict[str, str]
    model_dtype: ModelDtype
    kv_cache_dtype: KvCacheDtype
    block_size: int
    environment: dict[str, str]
    extra_args: list[str]


class LaunchSourceNames(Record):
    """`sources` of a launch record: where the allocation, device mappings, transfer and runtime came from.
    The per-field layers are in `config/engine-launch.sources.json`."""

    allocation: str
    devices: str
    transfer: str
    runtime: str


class EngineLaunch(Record):
    """One engine's entry in `config/engine-launch.local.json`. `args` follow `vllm serve`."""

    host_id: str
    accelerator: str
    gpu_ids: list[str]
    tensor_parallel_size: int
    gpu_visibility_env: Literal["CUDA_VISIBLE_DEVICES"] = "CUDA_VISIBLE_DEVICES"
    accelerator_devices: list[str]
    network_mode: Literal["host"] = "host"
    fabric_address: str
    ports: Ports
    transfer: Transfer
    sources: LaunchSourceNames
    runtime: Runtime
    args: list[str]


class EngineLaunchConfig(Record):
    """`config/engine-launch.local.json`."""

    schema_: Literal["narwhal.engine-launch"] = Field(default=LAUNCH_SCHEMA, alias="schema")
    schema_version: Literal[1] = 1
    engines: dict[str, EngineLaunch]


class LaunchSources(Record):
    """`config/engine-launch.sources.json`: for every engine and launch value, where it came from.

    A field whose source is the same for every engine (a default, a fleet-wide `.env` value) is listed once
    under `shared`; `engines` holds each engine's other fields. So the file grows with the engines, not with
    engines times fields times a fleet-wide copy.
    """

    schema_: Literal["narwhal.engine-launch-sources"] = Field(default="narwhal.engine-launch-sources", alias="schema")
    schema_version: Literal[2] = 2
    shared: dict[str, Source]
    engines: dict[str, dict[str, Source]]

    def source(self, engine: str, field: str) -> Source:
        """Where `engine`'s value of `field` came from (KeyError for an unknown engine or field)."""
        own = self.engines[engine]
        return own[field] if field in own else self.shared[field]


class _EngineFileHeader(Record):
    schema_: Literal["narwhal.engine-launch"] = Field(default=LAUNCH_SCHEMA, alias="schema")
    schema_version: Literal[1] = 1
    role: str
    iid: str
    serving_role: ServingRole


class EngineLaunchFile(EngineLaunch, _EngineFileHeader):
    """`config/engine-launch.engine-<n>.json`: the header (schema, the engine's `role` name, iid, the fleet's
    serving role), its entry, the `environment` the launcher resolves for it (GPU visibility, UCX and NIXL
    selection) and `vllm_args`, the arguments the launch record itself implies."""

    environment: dict[str, str]
    vllm_args: list[str]

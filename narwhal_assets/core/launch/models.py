"""Pydantic models of the launch files: `config/engine-launch.local.json`, its source index, and the
per-engine `config/engine-launch.engine-<n>.json` shipped to each engine host."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from narwhal_assets.core.launch.placement import Transfer
from narwhal_assets.core.launch.policy import Source
from narwhal_assets.core.records import Record

ServingRole = Literal["prefill", "decode"]
ENGINE_FILE_SCHEMA = "narwhal.engine-launch.engine"


class Ports(Record):
    engine: int
    attestation: int
    nixl_side_channel: int
    nixl_side_channel_window: tuple[int, int]
    ucx_tcp_port_range: str


class Runtime(Record):
    expected_packages: list[str]
    model_dtype: str
    kv_cache_dtype: str
    block_size: int
    environment: dict[str, str]
    extra_args: list[str]


class EngineLaunch(Record):
    """One engine's entry in `config/engine-launch.local.json`. `args` follow `vllm serve`."""

    host_id: str
    accelerator: str
    gpu_ids: list[int | str]
    tensor_parallel_size: int
    gpu_visibility_env: Literal["CUDA_VISIBLE_DEVICES"] = "CUDA_VISIBLE_DEVICES"
    accelerator_devices: list[str]
    network_mode: Literal["host"] = "host"
    fabric_address: str
    ports: Ports
    transfer: Transfer
    sources: dict[str, Source]
    runtime: Runtime
    args: list[str]


class EngineLaunchConfig(Record):
    """`config/engine-launch.local.json`."""

    schema_: Literal["narwhal.engine-launch"] = Field(default="narwhal.engine-launch", alias="schema")
    schema_version: Literal[1] = 1
    engines: dict[str, EngineLaunch]


class LaunchSources(Record):
    """`config/engine-launch.sources.json`: for every engine and launch value, where it came from."""

    schema_: Literal["narwhal.engine-launch-sources"] = Field(default="narwhal.engine-launch-sources", alias="schema")
    schema_version: Literal[1] = 1
    engines: dict[str, dict[str, Source]]


class _EngineFileHeader(Record):
    schema_: Literal["narwhal.engine-launch.engine"] = Field(default=ENGINE_FILE_SCHEMA, alias="schema")
    schema_version: Literal[1] = 1
    engine: str
    iid: str
    role: ServingRole


class EngineLaunchFile(EngineLaunch, _EngineFileHeader):
    """`config/engine-launch.engine-<n>.json`: header (schema, engine, iid, role), one engine's entry, and its
    resolved environment (the same mapping as `runtime.environment`, at the top level for the launcher)."""

    environment: dict[str, str]

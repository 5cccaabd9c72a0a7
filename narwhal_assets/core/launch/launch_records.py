"""Engine launch records: `config/engine-launch.local.json`, its source index and the per-engine files.

Built from the launch policy (`core/policy.py`), one host observation per engine and, when known, the
model's `config.json`. Every problem of every engine is reported in one pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from narwhal_assets.core.discovery.observations import HostObservation
from narwhal_assets.core.errors import InputError, Problems, raise_if
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.launch.engine_args import ServeSettings, environment_problems, serve_args
from narwhal_assets.core.launch.engine_policy import EnginePolicy, engine_policy
from narwhal_assets.core.launch.models import (
    ENGINE_FILE_SCHEMA,
    EngineLaunch,
    EngineLaunchConfig,
    EngineLaunchFile,
    LaunchSources,
    Ports,
    Runtime,
    ServingRole,
)
from narwhal_assets.core.launch.placement import (
    GpuAllocation,
    Transfer,
    accelerator_name,
    allocate_gpus,
    fabric_address,
    select_transfer,
)
from narwhal_assets.core.launch.policy import Resolved, Source, SourceLayer, resolve_engine_field
from narwhal_assets.core.launch.ports import PortClaim, nixl_window, overlap_problems, window_problem
from narwhal_assets.core.roles import Role

__all__ = [
    "ENGINE_FILE_SCHEMA",
    "EngineLaunch",
    "EngineLaunchConfig",
    "EngineLaunchFile",
    "LaunchSources",
    "Resolved",
    "ServingRole",
    "build_launch_config",
    "engine_launch_file",
    "launch_sources",
    "resolve_engine_field",
]

EXPECTED_PACKAGES = ("vllm", "nixl")
ModelConfig = Mapping[str, Any]


@dataclass(frozen=True)
class _Engine:
    """What one engine needs besides settings: its host's observation and the model's config."""

    n: int
    observation: HostObservation
    colocated: bool
    observation_file: str
    model_config: ModelConfig

    @property
    def name(self) -> str:
        return Role.engine(self.n).name


@dataclass(frozen=True)
class _Built:
    entry: EngineLaunch
    gpus: frozenset[int]
    gpu_variable: str
    claims: tuple[PortClaim, ...]


def build_launch_config(
    settings: Settings,
    inventory: Inventory,
    observations: Mapping[str, HostObservation],
    *,
    model_configs: Mapping[int, ModelConfig] | None = None,
    observation_dir: str | None = None,
) -> EngineLaunchConfig:
    """Launch records for every engine of the inventory.

    `model_configs` (engine number -> parsed `config.json`) caps the default max model length and names
    the model dtype; `observation_dir` prefixes the observation file names in the source index.
    """
    problems = Problems()
    built: dict[int, _Built] = {}
    for n in inventory.engine_numbers():
        host = inventory.host_for_role(Role.engine(n).name)
        observation = observations.get(host.id)
        if observation is None:
            problems.append(f"host {host.id}: no observation for engine-{n} (run discovery)")
            continue
        obs_file = f"{observation_dir}/{host.id}.json" if observation_dir else f"{host.id}.json"
        engine = _Engine(n, observation, len(host.engine_numbers()) > 1, obs_file, (model_configs or {}).get(n, {}))
        if (entry := problems.attempt(_build_engine, settings, engine)) is not None:
            built[n] = entry
    raise_if(problems + _host_problems(built))
    return EngineLaunchConfig(engines={Role.engine(n).name: b.entry for n, b in sorted(built.items())})


def launch_sources(config: EngineLaunchConfig) -> LaunchSources:
    """The source index is a projection of the records, so the two cannot disagree."""
    return LaunchSources(engines={role: dict(entry.sources) for role, entry in config.engines.items()})


def engine_launch_file(config: EngineLaunchConfig, n: int, role: ServingRole) -> EngineLaunchFile:
    """The per-engine file shipped to engine `n`'s host; `role` comes from the fleet."""
    entry = config.engines.get(Role.engine(n).name)
    if entry is None:
        raise InputError([f"config/engine-launch.local.json: engines: no record for engine-{n}"])
    return EngineLaunchFile.model_validate({
        **entry.model_dump(), "engine": Role.engine(n).name, "iid": Role.engine(n).iid, "role": role,
        "environment": dict(entry.runtime.environment),
    })


@dataclass(frozen=True)
class _Placement:
    """Everything derived from the host observation (and the model config) for one engine."""

    allocation: GpuAllocation
    accelerator: str
    tensor_parallel: int
    address: str
    transfer: Transfer
    max_model_len: int
    max_model_len_source: Source


def _build_engine(settings: Settings, engine: _Engine) -> _Built:
    policy, resolved = engine_policy(settings, engine.n)
    place = _place(engine, policy, resolved)
    ucx_range = "{}-{}".format(*policy.ucx_tcp_port_range)
    environment = {
        "CUDA_VISIBLE_DEVICES": place.allocation.visible_devices(),
        "UCX_TLS": place.transfer.ucx_tls,
        "UCX_NET_DEVICES": place.transfer.net_devices,
        "UCX_TCP_PORT_RANGE": ucx_range,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": place.address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(policy.nixl_side_channel_port),
        **policy.engine_env,
    }
    raise_if(environment_problems(environment, engine.n))
    claims = _port_claims(engine.name, policy, resolved, place.tensor_parallel)
    raise_if([p for p in map(window_problem, claims) if p])
    entry = EngineLaunch(
        host_id=engine.observation.host_id,
        accelerator=place.accelerator,
        gpu_ids=list(place.allocation.ids),
        tensor_parallel_size=place.tensor_parallel,
        accelerator_devices=place.allocation.device_paths(),
        fabric_address=place.address,
        ports=Ports(
            engine=policy.engine_port,
            attestation=policy.attest_port,
            nixl_side_channel=policy.nixl_side_channel_port,
            nixl_side_channel_window=nixl_window(policy.nixl_side_channel_port, place.tensor_parallel),
            ucx_tcp_port_range=ucx_range,
        ),
        transfer=place.transfer,
        sources=_sources(resolved, engine, place.max_model_len_source),
        runtime=Runtime(
            expected_packages=list(EXPECTED_PACKAGES),
            model_dtype=_model_dtype(engine.model_config),
            kv_cache_dtype=policy.kv_cache_dtype,
            block_size=policy.kv_block_size,
            environment=environment,
            extra_args=list(policy.extra_engine_args),
        ),
        args=serve_args(_serve_settings(policy, place.tensor_parallel, place.max_model_len)),
    )
    return _Built(entry, place.allocation.indices, resolved["GPU_IDS"].name, claims)


def _place(engine: _Engine, policy: EnginePolicy, resolved: dict[str, Resolved]) -> _Placement:
    """GPUs, TP size, fabric address, UCX devices and max model length; independent problems together."""
    n, obs = engine.n, engine.observation
    problems = Problems()
    allocation = problems.attempt(allocate_gpus, obs, n, resolved["GPU_IDS"], engine.colocated)
    address = problems.attempt(fabric_address, obs, policy.fabric_interface, resolved["FABRIC_INTERFACE"].name)
    transfer = problems.attempt(select_transfer, obs, n, policy.transfer_transport, policy.fabric_interface,
                       policy.ucx_gpu_tls, resolved["TRANSFER_TRANSPORT"].name)
    max_len = problems.attempt(_max_model_len, policy.max_model_len, resolved["MAX_MODEL_LEN"], engine)
    accelerator = tp = None
    if allocation is not None:
        accelerator = problems.attempt(accelerator_name, allocation, n)
        tp = problems.attempt(_tensor_parallel, policy.tensor_parallel_size, allocation, resolved, n)
    raise_if(problems)
    return _Placement(allocation, accelerator, tp, address, transfer, *max_len)


def _tensor_parallel(requested: int | None, allocation: GpuAllocation, resolved: dict[str, Resolved], n: int) -> int:
    count = len(allocation.gpus)
    if requested is None:
        return count
    if requested > count:
        raise InputError([f"engine-{n}: {resolved['TENSOR_PARALLEL_SIZE'].name} must be 1..{count} (GPUs "
                          f"allocated by {resolved['GPU_IDS'].name})"])
    return requested


def _model_value(config: ModelConfig, key: str) -> Any:
    """A key of the model config, or of its `text_config` (multimodal checkpoints nest it there)."""
    text_config = config.get("text_config")
    return config.get(key, text_config.get(key) if isinstance(text_config, Mapping) else None)


def _max_model_len(value: int, resolved: Resolved, engine: _Engine) -> tuple[int, Source]:
    """The default is capped by `max_position_embeddings`; an explicit value above it is refused."""
    limit = _model_value(engine.model_config, "max_position_embeddings")
    if not isinstance(limit, int) or value <= limit:
        return value, resolved.source()
    if resolved.layer is SourceLayer.DEFAULT:
        return limit, resolved.source(detail=f"default {value} capped by the model's max_position_embeddings")
    raise InputError([f"engine-{engine.n}: {resolved.name} exceeds the model's max_position_embeddings "
                      f"({limit})"])


def _model_dtype(config: ModelConfig) -> str:
    dtype = _model_value(config, "torch_dtype") or _model_value(config, "dtype")
    return dtype if isinstance(dtype, str) else "auto"


def _serve_settings(policy: EnginePolicy, tp: int, max_len: int) -> ServeSettings:
    return ServeSettings(
        model_dir=policy.model_dir,
        served_model_name=policy.engine_model_name,
        tensor_parallel_size=tp,
        max_num_seqs=policy.max_num_seqs,
        max_model_len=max_len,
        gpu_memory_utilization=policy.gpu_memory_utilization,
        block_size=policy.kv_block_size,
        kv_cache_dtype=policy.kv_cache_dtype,
        enforce_eager=policy.enforce_eager,
        port=policy.engine_port,
        extra_args=policy.extra_engine_args,
    )


def _port_claims(role: str, policy: EnginePolicy, resolved: dict[str, Resolved], tp: int) -> tuple[PortClaim, ...]:
    """Engine, attestation, the NIXL side channel plus one port per TP rank, and the UCX TCP range."""
    return (
        PortClaim(policy.engine_port, policy.engine_port, role, resolved["ENGINE_PORT"].name),
        PortClaim(policy.attest_port, policy.attest_port, role, resolved["ATTEST_PORT"].name),
        PortClaim(*nixl_window(policy.nixl_side_channel_port, tp), role, resolved["NIXL_SIDE_CHANNEL_PORT"].name),
        PortClaim(*policy.ucx_tcp_port_range, role, resolved["UCX_TCP_PORT_RANGE"].name),
    )


def _sources(resolved: dict[str, Resolved], engine: _Engine, max_len_source: Source) -> dict[str, Source]:
    observed = partial(Source, layer=SourceLayer.DISCOVERED, observation=engine.observation_file)
    sources = {r.field.key: r.source() for r in resolved.values()}
    sources["max_model_len"] = max_len_source
    if resolved["GPU_IDS"].value is None:
        sources["gpu_ids"] = observed(detail="every observed GPU")
    if resolved["TENSOR_PARALLEL_SIZE"].value is None:
        sources["tensor_parallel_size"] = Source(layer=SourceLayer.DEFAULT, detail="number of allocated GPUs")
    interface = resolved["FABRIC_INTERFACE"].value
    sources["accelerator"] = observed(detail="nvidia-smi name of the allocated GPUs")
    sources["accelerator_devices"] = observed(detail="device nodes of the allocated GPUs")
    sources["fabric_address"] = observed(variable=resolved["FABRIC_INTERFACE"].name,
                                         detail=f"global address of {interface}")
    sources["transfer"] = observed(variable=resolved["TRANSFER_TRANSPORT"].name,
                                   detail="ACTIVE RDMA ports or the fabric interface")
    if _model_dtype(engine.model_config) == "auto":
        sources["model_dtype"] = Source(layer=SourceLayer.DEFAULT, detail="model config not known")
    else:
        sources["model_dtype"] = Source(layer=SourceLayer.DISCOVERED, detail="model config.json")
    return sources


def _host_problems(built: Mapping[int, _Built]) -> list[str]:
    """Port overlaps and shared GPUs between engines on one host."""
    by_host: dict[str, list[tuple[int, _Built]]] = defaultdict(list)
    for n, b in sorted(built.items()):
        by_host[b.entry.host_id].append((n, b))
    problems = Problems()
    for host_id, engines in by_host.items():
        problems += overlap_problems(host_id, [c for _, b in engines for c in b.claims])
        for i, (n, first) in enumerate(engines):
            for m, second in engines[i + 1 :]:
                shared = sorted(first.gpus & second.gpus)
                if shared:
                    problems.append(
                        f"host {host_id}: engine-{n} ({first.gpu_variable}) and engine-{m} "
                        f"({second.gpu_variable}) share GPU index {', '.join(map(str, shared))}; colocated "
                        "engines need disjoint allocations"
                    )
    return problems

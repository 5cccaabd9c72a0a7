"""Engine launch records: `config/engine-launch.local.json`, its source index and the per-engine files.

Built from the launch policy (`core/launch/policy.py`), one host observation per engine and, when known,
the model's `config.json`, in the shape the serving fleet's launcher reads (`core/launch/models.py`).
Every problem of every engine is reported in one pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from narwhal_assets.core.discovery.observations import HostObservation
from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import InputError, Problems, raise_if
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.launch.engine_args import ServeSettings, engine_flags, environment_problems, serve_args
from narwhal_assets.core.launch.engine_policy import MODEL_DTYPES, EnginePolicy, engine_policy
from narwhal_assets.core.launch.models import (
    EngineLaunch,
    EngineLaunchConfig,
    EngineLaunchFile,
    LaunchSourceNames,
    LaunchSources,
    ModelDtype,
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
from narwhal_assets.core.launch.policy import Resolved, Source, SourceLayer, operator_lookup, resolve_engine_field
from narwhal_assets.core.launch.ports import PortClaim, nixl_window, overlap_problems, window_problem
from narwhal_assets.core.roles import Role

__all__ = [
    "EngineLaunch",
    "EngineLaunchConfig",
    "EngineLaunchFile",
    "LaunchRecords",
    "LaunchSources",
    "Resolved",
    "ServingRole",
    "build_launch_records",
    "engine_launch_file",
    "engines_by_host",
    "managed_environment",
    "resolve_engine_field",
]

# The packages the serving fleet's launcher pins, as the probe names them; vllm and one NIXL build are required.
PINNED_PACKAGES = ("vllm", "nixl", "nixl-rocm", "torch")
NIXL_PACKAGES = ("nixl", "nixl-rocm")
DEFAULT_MODEL_DTYPE = "bfloat16"
ModelConfig = Mapping[str, Any]


@dataclass(frozen=True)
class LaunchRecords:
    """`config/engine-launch.local.json` and its source index, built together."""

    config: EngineLaunchConfig
    sources: LaunchSources


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
    sources: dict[str, Source]


def build_launch_records(
    settings: Settings,
    inventory: Inventory,
    observations: Mapping[str, HostObservation],
    *,
    model_configs: Mapping[int, ModelConfig] | None = None,
    observation_dir: str | None = None,
) -> LaunchRecords:
    """Launch records for every engine of the inventory, and where each of their values came from.

    `model_configs` (engine number -> parsed `config.json`) caps the default max model length and names
    the model dtype; `observation_dir` prefixes the observation file names in the sources.
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
    names = {n: Role.engine(n).name for n in sorted(built)}
    config = EngineLaunchConfig(engines={names[n]: built[n].entry for n in names})
    return LaunchRecords(config, _source_index({names[n]: built[n].sources for n in names}))


def engine_launch_file(
    config: EngineLaunchConfig, n: int, serving_role: ServingRole, host_engines: Sequence[str] | None = None
) -> EngineLaunchFile:
    """The per-engine file shipped to engine `n`'s host; `serving_role` comes from the fleet, `host_engines`
    (every engine on that host, in order; `engines_by_host` of the config) saves a look through all records."""
    name = Role.engine(n).name
    entry = config.engines.get(name)
    if entry is None:
        raise InputError([f"config/engine-launch.local.json: engines: no record for {name}"])
    together = host_engines if host_engines is not None else engines_by_host(config)[entry.host_id]
    return EngineLaunchFile.model_validate({
        **entry.model_dump(), "role": name, "iid": Role.engine(n).iid, "serving_role": serving_role,
        "environment": managed_environment(config, name, together),
        "vllm_args": ["--tensor-parallel-size", str(entry.tensor_parallel_size)],
    })  # fmt: skip


def engines_by_host(config: EngineLaunchConfig) -> dict[str, list[str]]:
    """Host id -> the engines it runs, in record order."""
    found: dict[str, list[str]] = defaultdict(list)
    for name, entry in config.engines.items():
        found[entry.host_id].append(name)
    return found


def managed_environment(config: EngineLaunchConfig, name: str, host_engines: Sequence[str]) -> dict[str, str]:
    """What the launcher sets for engine `name` from its record: GPU visibility (its own GPUs first, then those
    of the other engines on its host, `host_engines`, which CUDA IPC between colocated engines needs;
    nvidia-smi's PCI order for the indices), the UCX selection and NIXL's address and side channel."""
    entry = config.engines[name]
    peers = [gpu for other in host_engines if other != name for gpu in config.engines[other].gpu_ids
             if gpu not in entry.gpu_ids]  # fmt: skip
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(dict.fromkeys([*entry.gpu_ids, *peers])),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "UCX_NET_DEVICES": entry.transfer.net_devices,
        "UCX_TLS": entry.transfer.ucx_tls,
        "UCX_TCP_PORT_RANGE": entry.ports.ucx_tcp_port_range,
        "NIXL_HOST_IP": entry.fabric_address,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": entry.fabric_address,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(entry.ports.nixl_side_channel),
    }


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
    model_dtype: ModelDtype
    packages: dict[str, str]


def _build_engine(settings: Settings, engine: _Engine) -> _Built:
    policy, resolved = engine_policy(settings, engine.n)
    raise_if(environment_problems(policy.engine_env, engine.n))
    place = _place(settings, engine, policy, resolved)
    ucx_range = "{}-{}".format(*policy.ucx_tcp_port_range)
    claims = _port_claims(engine.name, policy, resolved, place.tensor_parallel)
    raise_if([p for p in map(window_problem, claims) if p])
    serve = _serve_settings(policy, place)
    entry = EngineLaunch(
        host_id=engine.observation.host_id,
        accelerator=place.accelerator,
        gpu_ids=place.allocation.ids,
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
        sources=_source_names(engine, resolved, place.transfer),
        runtime=Runtime(
            expected_packages=place.packages,
            model_dtype=place.model_dtype,
            kv_cache_dtype=policy.kv_cache_dtype,
            block_size=policy.kv_block_size,
            environment=policy.engine_env,
            extra_args=engine_flags(serve),
        ),
        args=serve_args(serve),
    )
    return _Built(entry, place.allocation.indices, resolved["GPU_IDS"].name, claims,
                  _field_sources(resolved, engine, place))  # fmt: skip


def _place(settings: Settings, engine: _Engine, policy: EnginePolicy, resolved: dict[str, Resolved]) -> _Placement:
    """GPUs, TP size, fabric address, UCX devices, max model length, dtype and the image's pinned packages;
    independent problems together."""
    n, obs = engine.n, engine.observation
    problems = Problems()
    allocation = problems.attempt(allocate_gpus, obs, n, resolved["GPU_IDS"], engine.colocated)
    selection = operator_lookup(settings, Role.engine(n).node_var("IP"))
    address = problems.attempt(fabric_address, obs, policy.fabric_interface, resolved["FABRIC_INTERFACE"].name, n,
                               selection)  # fmt: skip
    transfer = problems.attempt(select_transfer, obs, n, policy.transfer_transport, policy.fabric_interface,
                                policy.ucx_gpu_tls, resolved["TRANSFER_TRANSPORT"].name)  # fmt: skip
    max_len = problems.attempt(_max_model_len, policy.max_model_len, resolved["MAX_MODEL_LEN"], engine)
    dtype = problems.attempt(_model_dtype, policy.model_dtype, engine)
    packages = problems.attempt(_pinned_packages, engine)
    accelerator = tp = None
    if allocation is not None:
        accelerator = problems.attempt(accelerator_name, allocation, n)
        tp = problems.attempt(_tensor_parallel, policy.tensor_parallel_size, allocation, resolved, n)
    raise_if(problems)  # so none of them is None
    assert allocation is not None and accelerator is not None and tp is not None and address is not None
    assert transfer is not None and max_len is not None and dtype is not None and packages is not None
    return _Placement(allocation, accelerator, tp, address, transfer, *max_len, dtype, packages)


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


def _model_dtype(chosen: ModelDtype | None, engine: _Engine) -> ModelDtype:
    """`NARWHAL_MODEL_DTYPE`, else the model config's dtype, else bfloat16; the serving fleet's launcher runs
    a two-byte dtype only, so a float32 checkpoint needs the variable set."""
    if chosen is not None:
        return chosen
    configured = _model_value(engine.model_config, "dtype") or _model_value(engine.model_config, "torch_dtype")
    dtype = configured if isinstance(configured, str) else DEFAULT_MODEL_DTYPE
    if dtype not in MODEL_DTYPES:
        raise InputError([f"engine-{engine.n}: the model config's dtype {printable(dtype, 40)!r} is not bfloat16 or "
                          "float16, the "
                          "dtypes the serving fleet's launcher runs; set NARWHAL_MODEL_DTYPE"])  # fmt: skip
    return cast("ModelDtype", dtype)


def _pinned_packages(engine: _Engine) -> dict[str, str]:
    """`runtime.expected_packages`: the versions discovery read inside the engine image."""
    image = engine.observation.image
    found = {name: version for name, version in (image.packages if image else {}).items() if name in PINNED_PACKAGES}
    missing = [label for label, names in (("vllm", ("vllm",)), ("nixl", NIXL_PACKAGES))
               if not any(name in found for name in names)]  # fmt: skip
    if missing:
        raise InputError([f"host {engine.observation.host_id}: engine-{engine.n} image has no {' or '.join(missing)} "
                          "package (read with importlib.metadata inside it); the serving fleet's launcher pins the "
                          "vllm and nixl versions"])  # fmt: skip
    return dict(sorted(found.items()))


def _serve_settings(policy: EnginePolicy, place: _Placement) -> ServeSettings:
    return ServeSettings(
        model_dir=policy.model_dir,
        served_model_name=policy.engine_model_name,
        tensor_parallel_size=place.tensor_parallel,
        max_num_seqs=policy.max_num_seqs,
        max_model_len=place.max_model_len,
        gpu_memory_utilization=policy.gpu_memory_utilization,
        block_size=policy.kv_block_size,
        kv_cache_dtype=policy.kv_cache_dtype,
        model_dtype=place.model_dtype,
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


def _source_names(engine: _Engine, resolved: dict[str, Resolved], transfer: Transfer) -> LaunchSourceNames:
    """`sources` of the launch record: the observation and the variables behind each part."""
    obs, gpu_ids = engine.observation_file, resolved["GPU_IDS"]
    rdma = transfer.transport == "ucx_rdma"
    return LaunchSourceNames(
        allocation=f"{obs} (nvidia-smi GPUs); {gpu_ids.variable or 'every observed GPU'}",
        devices=f"{obs} (GPU device nodes{', /dev/infiniband character devices' if rdma else ''})",
        transfer=f"{resolved['TRANSFER_TRANSPORT'].name} over {resolved['FABRIC_INTERFACE'].name}: {obs} (fabric "
                 f"interface addresses{', ACTIVE RDMA ports' if rdma else ''})",
        runtime=f"{obs} (image packages, model config) and the launch policy (engine-launch.sources.json)",
    )  # fmt: skip


def _field_sources(resolved: dict[str, Resolved], engine: _Engine, place: _Placement) -> dict[str, Source]:
    """Where each launch value came from: every policy field, and what discovery derived."""
    observed = partial(Source, layer=SourceLayer.DISCOVERED, observation=engine.observation_file)
    sources = {r.field.key: r.source() for r in resolved.values()}
    sources["max_model_len"] = place.max_model_len_source
    if resolved["GPU_IDS"].value is None:
        sources["gpu_ids"] = observed(detail="every observed GPU")
    if resolved["TENSOR_PARALLEL_SIZE"].value is None:
        sources["tensor_parallel_size"] = Source(layer=SourceLayer.DEFAULT, detail="number of allocated GPUs")
    interface = resolved["FABRIC_INTERFACE"].value
    sources["accelerator"] = observed(detail="nvidia-smi name of the allocated GPUs")
    sources["accelerator_devices"] = observed(detail="device nodes of the allocated GPUs")
    sources["fabric_address"] = observed(variable=resolved["FABRIC_INTERFACE"].name,
                                         detail=f"the global address of {interface}")  # fmt: skip
    sources["transfer"] = observed(variable=resolved["TRANSFER_TRANSPORT"].name,
                                   detail="ACTIVE RDMA ports and /dev/infiniband devices, or the fabric interface")
    sources["expected_packages"] = observed(detail="importlib.metadata inside the engine image")
    if resolved["MODEL_DTYPE"].value is None:
        configured = any(_model_value(engine.model_config, key) for key in ("dtype", "torch_dtype"))
        sources["model_dtype"] = (Source(layer=SourceLayer.DISCOVERED, detail="model config.json") if configured
                                  else Source(layer=SourceLayer.DEFAULT, detail=DEFAULT_MODEL_DTYPE))  # fmt: skip
    return sources


def _source_index(per_engine: Mapping[str, dict[str, Source]]) -> LaunchSources:
    """Fields whose source every engine shares go under `shared`, once; the rest per engine."""
    engines = list(per_engine.values())
    shared = {key: source for key, source in (engines[0].items() if engines else ())
              if all(other.get(key) == source for other in engines[1:])}  # fmt: skip
    return LaunchSources(shared=shared, engines={
        name: {key: source for key, source in sources.items() if shared.get(key) != source}
        for name, sources in per_engine.items()
    })  # fmt: skip


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

"""One engine's launch policy, resolved and parsed: every field at once, every problem in one pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from narwhal_assets.core.errors import Problems, raise_if
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.launch.engine_args import parse_extra_args, parse_extra_env
from narwhal_assets.core.launch.models import KvCacheDtype, ModelDtype
from narwhal_assets.core.launch.placement import GPU_TLS, TRANSPORTS, GpuTls
from narwhal_assets.core.launch.policy import (
    FIELDS,
    Resolved,
    parse_choice,
    parse_fraction,
    parse_host_dir,
    parse_image,
    parse_int,
    parse_interface,
    parse_sha256,
    parse_text,
    required_value,
    resolve_engine_field,
)
from narwhal_assets.core.launch.ports import parse_port, parse_port_range

KV_BLOCK_SIZES = ("8", "16", "32", "64", "128", "256")
KV_CACHE_DTYPES = ("auto",)  # the serving fleet's launcher runs a two-byte model dtype with an auto KV cache
MODEL_DTYPES = ("bfloat16", "float16")
MAX_TENSOR_PARALLEL = 64


@dataclass(frozen=True)
class EnginePolicy:
    """One engine's parsed launch policy; attribute names are the lower-cased policy field names."""

    engine_image: str
    engine_model_name: str
    model_dir: str
    run_dir: str
    model_config_sha256: str
    fabric_interface: str
    engine_port: int
    attest_port: int
    nixl_side_channel_port: int
    ucx_tcp_port_range: tuple[int, int]
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    kv_block_size: int
    kv_cache_dtype: KvCacheDtype
    model_dtype: ModelDtype | None
    enforce_eager: bool
    transfer_transport: str
    ucx_gpu_tls: GpuTls
    tensor_parallel_size: int | None
    extra_engine_args: tuple[str, ...]
    engine_env: dict[str, str]


def _optional(parse: Callable[[Resolved, int], Any]) -> Callable[[Resolved, int], Any]:
    return lambda resolved, n: None if resolved.value is None else parse(resolved, n)


_PARSERS: dict[str, Callable[[Resolved, int], Any]] = {
    "ENGINE_IMAGE": parse_image,
    "ENGINE_MODEL_NAME": parse_text,
    "MODEL_DIR": parse_host_dir,
    "RUN_DIR": parse_text,
    "MODEL_CONFIG_SHA256": parse_sha256,
    "FABRIC_INTERFACE": parse_interface,
    "ENGINE_PORT": parse_port,
    "ATTEST_PORT": parse_port,
    "NIXL_SIDE_CHANNEL_PORT": parse_port,
    "UCX_TCP_PORT_RANGE": parse_port_range,
    "MAX_MODEL_LEN": partial(parse_int, low=1, high=1 << 24),
    "MAX_NUM_SEQS": partial(parse_int, low=1, high=1 << 16),
    "GPU_MEMORY_UTILIZATION": parse_fraction,
    "KV_BLOCK_SIZE": lambda r, n: int(parse_choice(r, n, KV_BLOCK_SIZES)),
    "KV_CACHE_DTYPE": partial(parse_choice, choices=KV_CACHE_DTYPES),
    "MODEL_DTYPE": _optional(partial(parse_choice, choices=MODEL_DTYPES)),
    "ENFORCE_EAGER": lambda r, n: parse_choice(r, n, ("0", "1")) == "1",
    "TRANSFER_TRANSPORT": partial(parse_choice, choices=TRANSPORTS),
    "UCX_GPU_TLS": partial(parse_choice, choices=GPU_TLS),
    "TENSOR_PARALLEL_SIZE": _optional(partial(parse_int, low=1, high=MAX_TENSOR_PARALLEL)),
    "EXTRA_ENGINE_ARGS": parse_extra_args,
    "ENGINE_ENV": parse_extra_env,
}


def resolve_all(settings: Settings, n: int) -> dict[str, Resolved]:
    problems = Problems()
    resolved: dict[str, Resolved] = {}
    for spec in FIELDS:
        value = problems.attempt(required_value if spec.required else resolve_engine_field, settings, n, spec.name)
        if value is not None:
            resolved[spec.name] = value
    raise_if(problems)
    return resolved


def parse_all(resolved: dict[str, Resolved], n: int) -> EnginePolicy:
    problems = Problems()
    values: dict[str, Any] = {
        name.lower(): problems.attempt(parse, resolved[name], n) for name, parse in _PARSERS.items()
    }
    raise_if(problems)
    return EnginePolicy(**values)


# Required fields discovery itself supplies per node (the observed image id, the config hash): before a
# discovery only an operator's pin of them can be checked (the image reference may still be a tag).
DISCOVERED_FIELDS = frozenset({"ENGINE_IMAGE", "MODEL_CONFIG_SHA256"})


def operator_policy_problems(settings: Settings, n: int) -> list[str]:
    """Every launch-policy problem of engine `n` that needs no host: what discovery checks before it connects
    (and before it writes anything)."""
    problems = Problems()
    for spec in FIELDS:
        discovered = spec.name in DISCOVERED_FIELDS
        getter = required_value if spec.required and spec.name != "MODEL_CONFIG_SHA256" else resolve_engine_field
        resolved = problems.attempt(getter, settings, n, spec.name)
        parse = _PARSERS.get(spec.name)  # GPU ids are checked against the GPUs discovery finds
        skipped = discovered and (spec.name == "ENGINE_IMAGE" or resolved is None or resolved.value is None)
        if resolved is None or parse is None or skipped:
            continue
        problems.attempt(parse, resolved, n)
    return list(problems)


def engine_policy(settings: Settings, n: int) -> tuple[EnginePolicy, dict[str, Resolved]]:
    """Engine `n`'s parsed policy plus the resolution of every field (for messages and the source index)."""
    resolved = resolve_all(settings, n)
    return parse_all(resolved, n), resolved

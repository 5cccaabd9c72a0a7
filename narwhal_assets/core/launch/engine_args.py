"""The engine's command line and environment: generation plus the allow-lists that bound operator input.

Flags the launch policy owns (ports, parallelism, `--max-num-seqs`, the KV connector) are deliberately not
allow-listed for `NARWHAL_EXTRA_ENGINE_ARGS`: a second `--max-num-seqs` would make the profiling limit
ambiguous, a second `--port` would break the port plan.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.launch.policy import Resolved, looks_like_credential

KV_TRANSFER_CONFIG = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))
ALLOWED_EXTRA_FLAGS = frozenset({
    "--calculate-kv-scales",
    "--compilation-config",
    "--cuda-graph-sizes",
    "--disable-cascade-attn",
    "--disable-custom-all-reduce",
    "--disable-log-requests",
    "--disable-log-stats",
    "--dtype",
    "--enable-chunked-prefill",
    "--enable-expert-parallel",
    "--enable-prefix-caching",
    "--generation-config",
    "--long-prefill-token-threshold",
    "--max-logprobs",
    "--max-num-batched-tokens",
    "--max-num-partial-prefills",
    "--no-enable-chunked-prefill",
    "--no-enable-prefix-caching",
    "--quantization",
    "--scheduling-policy",
    "--seed",
    "--swap-space",
    "--tokenizer-mode",
    "--uvicorn-log-level",
})
# Set by the launch policy; the operator changes them through their NARWHAL_ variables instead.
GENERATED_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES",
    "UCX_NET_DEVICES",
    "UCX_TCP_PORT_RANGE",
    "UCX_TLS",
    "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT",
})
ALLOWED_EXTRA_ENV = frozenset({"HF_HUB_OFFLINE", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "TRANSFORMERS_OFFLINE"})
ALLOWED_ENV_PREFIXES = ("NCCL_", "NIXL_", "UCX_", "VLLM_")
_ENV_NAME_RE = re.compile(r"[A-Z_][A-Z0-9_]*")
_NUMBER_RE = re.compile(r"-?[0-9]+(\.[0-9]+)?")


@dataclass(frozen=True)
class ServeSettings:
    """Everything `vllm serve` is told on its command line."""

    model_dir: str
    served_model_name: str
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    block_size: int
    kv_cache_dtype: str
    enforce_eager: bool
    port: int
    extra_args: tuple[str, ...]


def serve_args(s: ServeSettings) -> list[str]:
    """Arguments after `vllm serve` (the launcher runs `--entrypoint vllm IMAGE serve <args>`)."""
    args = [
        s.model_dir,
        "--served-model-name", s.served_model_name,
        "--tensor-parallel-size", str(s.tensor_parallel_size),
        "--max-num-seqs", str(s.max_num_seqs),
        "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", repr(s.gpu_memory_utilization),
        "--block-size", str(s.block_size),
        "--kv-cache-dtype", s.kv_cache_dtype,
        "--port", str(s.port),
        "--kv-transfer-config", KV_TRANSFER_CONFIG,
    ]
    if s.enforce_eager:
        args.append("--enforce-eager")
    return args + list(s.extra_args)


def parse_extra_args(resolved: Resolved, n: int) -> tuple[str, ...]:
    """Shell-split `NARWHAL_EXTRA_ENGINE_ARGS`; every flag must be allow-listed, values follow a flag."""
    words = _split(resolved, n)
    problems = []
    for i, word in enumerate(words):
        if word.startswith("-") and not _NUMBER_RE.fullmatch(word):
            flag = word.split("=", 1)[0]
            if flag not in ALLOWED_EXTRA_FLAGS:
                problems.append(f"engine-{n}: {resolved.name}: flag {flag} is not allowed (the allow-list is in "
                                "docs/launch-policy.md)")
        elif i == 0:
            problems.append(f"engine-{n}: {resolved.name} must start with a flag")
    if problems:
        raise InputError(problems)
    return tuple(words)


def parse_extra_env(resolved: Resolved, n: int) -> dict[str, str]:
    """Shell-split `NARWHAL_ENGINE_ENV` into `NAME=value` pairs with allow-listed names."""
    values: dict[str, str] = {}
    problems = []
    for word in _split(resolved, n):
        name, sep, value = word.partition("=")
        problem = env_name_problem(name) if sep else "is not NAME=value"
        if problem is None and name in GENERATED_ENV:
            problem = "is set by the launch policy; change its NARWHAL_ variable instead"
        if problem:
            problems.append(f"engine-{n}: {resolved.name}: {name if sep else 'a word'} {problem}")
        values[name] = value
    if problems:
        raise InputError(problems)
    return values


def env_name_problem(name: str) -> str | None:
    """Why `name` may not be in an engine's environment, or None when it may."""
    if not _ENV_NAME_RE.fullmatch(name):
        return "is not an upper-case variable name"
    if looks_like_credential(name):
        return "looks like a credential and never enters an engine's environment"
    if name in GENERATED_ENV or name in ALLOWED_EXTRA_ENV or name.startswith(ALLOWED_ENV_PREFIXES):
        return None
    return f"is not allow-listed (allowed: {', '.join(sorted(ALLOWED_EXTRA_ENV))}, {'*, '.join(ALLOWED_ENV_PREFIXES)}*)"


def environment_problems(environment: dict[str, str], n: int) -> list[str]:
    """Every name of a resolved environment must pass the allow-list."""
    return [f"engine-{n}: environment {name} {problem}" for name in sorted(environment)
            if (problem := env_name_problem(name)) is not None]


def _split(resolved: Resolved, n: int) -> list[str]:
    try:
        return shlex.split(resolved.value or "")
    except ValueError:
        raise InputError([f"engine-{n}: {resolved.name} is not valid shell-quoted words"]) from None

"""The engine's command line and environment: generation plus the allow-lists that bound operator input.

The allow-lists are the serving fleet launcher's own (docs/launch-policy.md): `runtime.extra_args` may hold
only the options it knows, each value option with its value, each flag alone; `runtime.environment` only
names with an engine prefix that it does not manage itself and that do not look like credentials or turn
off NIXL's compatibility check. Flags the launch policy owns (`--max-num-seqs`, `--max-model-len`,
`--gpu-memory-utilization`, `--enforce-eager`) are set through their `NARWHAL_` variables instead: a
second `--max-num-seqs` would make the profiling limit ambiguous.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.launch.policy import Resolved, looks_like_credential

# The KV connector as the serving fleet's launcher configures it: NIXL over UCX, a failed load fails the
# request, and mismatched peers are refused at the handshake.
KV_TRANSFER_CONFIG = json.dumps(
    {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail",
     "kv_connector_extra_config": {"backends": ["UCX"], "enforce_handshake_compat": True}},
    separators=(",", ":"),
)  # fmt: skip
VALUE_FLAGS = frozenset({"--max-num-batched-tokens", "--reasoning-parser", "--attention-backend"})
BARE_FLAGS = frozenset({"--trust-remote-code", "--language-model-only", "--async-scheduling",
                        "--no-disable-hybrid-kv-cache-manager", "--disable-hybrid-kv-cache-manager"})  # fmt: skip
POLICY_FLAGS = {
    "--max-model-len": "NARWHAL_MAX_MODEL_LEN",
    "--max-num-seqs": "NARWHAL_MAX_NUM_SEQS",
    "--gpu-memory-utilization": "NARWHAL_GPU_MEMORY_UTILIZATION",
    "--enforce-eager": "NARWHAL_ENFORCE_EAGER",
}
# The launcher sets these itself (GPU visibility, UCX and NIXL selection, the engine credential).
MANAGED_ENV = frozenset({
    "CUDA_DEVICE_ORDER",
    "CUDA_VISIBLE_DEVICES",
    "NIXL_HOST_IP",
    "PYTHONPATH",
    "ROCR_VISIBLE_DEVICES",
    "UCX_NET_DEVICES",
    "UCX_TCP_PORT_RANGE",
    "UCX_TLS",
    "VLLM_API_KEY",
    "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT",
})
ALLOWED_ENV_PREFIXES = ("VLLM_", "UCX_", "NIXL_", "PYTORCH_", "SAFETENSORS_")
COMPAT_SKIP = "SKIP_COMPAT"
_ENV_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")


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
    model_dtype: str
    enforce_eager: bool
    port: int
    extra_args: tuple[str, ...]


def serve_args(s: ServeSettings) -> list[str]:
    """Arguments after `vllm serve` (the launcher runs `--entrypoint vllm IMAGE serve <args>`): the model and
    what the launch record fixes, then `runtime.extra_args` (`engine_flags`)."""
    return [
        s.model_dir,
        "--served-model-name", s.served_model_name,
        "--tensor-parallel-size", str(s.tensor_parallel_size),
        "--dtype", s.model_dtype,
        "--kv-cache-dtype", s.kv_cache_dtype,
        "--block-size", str(s.block_size),
        "--port", str(s.port),
        "--no-enable-prefix-caching",
        "--kv-transfer-config", KV_TRANSFER_CONFIG,
        *engine_flags(s),
    ]  # fmt: skip


def engine_flags(s: ServeSettings) -> list[str]:
    """`runtime.extra_args`: the policy's flags (in the serving fleet's default order), then the operator's."""
    flags = ["--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
             "--gpu-memory-utilization", repr(s.gpu_memory_utilization)]  # fmt: skip
    return [*flags, *(["--enforce-eager"] if s.enforce_eager else []), *s.extra_args]


def parse_extra_args(resolved: Resolved, n: int) -> tuple[str, ...]:
    """Shell-split `NARWHAL_EXTRA_ENGINE_ARGS` into the launcher's option list: each value option followed by
    its value (`--flag=value` is split in two), each bare flag alone, nothing else."""
    words = [part for word in _split(resolved, n) for part in _option_parts(word)]
    where = f"engine-{n}: {resolved.name}"
    problems = []
    index = 0
    while index < len(words):
        word = words[index]
        if word in VALUE_FLAGS and index + 1 < len(words) and not words[index + 1].startswith("--"):
            index += 2
            continue
        if word in BARE_FLAGS:
            index += 1
            continue
        if word in VALUE_FLAGS:
            problems.append(f"{where}: {word} needs a value")
        elif word in POLICY_FLAGS:
            problems.append(f"{where}: flag {word} is set by the launch policy; set {POLICY_FLAGS[word]} instead")
        elif word.startswith("-"):
            problems.append(f"{where}: flag {word} is not allowed (the serving fleet's launcher accepts "
                            f"{', '.join(sorted(VALUE_FLAGS | BARE_FLAGS))})")  # fmt: skip
        else:
            problems.append(f"{where}: {_printable_word(word)} follows no option that takes a value")
        index += 1
    if problems:
        raise InputError(problems)
    return tuple(words)


def parse_extra_env(resolved: Resolved, n: int) -> dict[str, str]:
    """Shell-split `NARWHAL_ENGINE_ENV` into `NAME=value` pairs with allow-listed names and one-line values."""
    values: dict[str, str] = {}
    problems = []
    for word in _split(resolved, n):
        name, sep, value = word.partition("=")
        problem = env_name_problem(name) if sep else "is not NAME=value"
        if problem is None and any(c in value for c in "\r\n\0"):
            problem = "has a value that is not one line"
        if problem:
            problems.append(f"engine-{n}: {resolved.name}: {name if sep else 'a word'} {problem}")
        values[name] = value
    if problems:
        raise InputError(problems)
    return values


def env_name_problem(name: str) -> str | None:
    """Why `name` may not be in an engine's `runtime.environment`, or None when it may."""
    if not _ENV_NAME_RE.fullmatch(name):
        return "is not an upper-case variable name"
    if COMPAT_SKIP in name:
        return "turns off NIXL's compatibility check, which the serving fleet refuses"
    if looks_like_credential(name):
        return "looks like a credential and never enters an engine's environment"
    if name in MANAGED_ENV:
        return "is set by the launcher from the launch record; change its NARWHAL_ variable instead"
    if name.startswith(ALLOWED_ENV_PREFIXES):
        return None
    return f"is not allow-listed (allowed: {'*, '.join(ALLOWED_ENV_PREFIXES)}*)"


def environment_problems(environment: dict[str, str], n: int) -> list[str]:
    """Every name of an engine's `runtime.environment` must pass the allow-list."""
    return [f"engine-{n}: environment {name} {problem}" for name in sorted(environment)
            if (problem := env_name_problem(name)) is not None]


def _printable_word(word: str) -> str:
    """A word for an error line: short ones as written, long ones cut (they may be a pasted secret)."""
    return repr(word) if len(word) <= 24 and word.isprintable() else "a word"


def _option_parts(word: str) -> list[str]:
    """`--flag=value` as the launcher's two words; anything else unchanged."""
    if word.startswith("--") and "=" in word:
        flag, _, value = word.partition("=")
        return [flag, value]
    return [word]


def _split(resolved: Resolved, n: int) -> list[str]:
    try:
        return shlex.split(resolved.value or "")
    except ValueError:
        raise InputError([f"engine-{n}: {resolved.name} is not valid shell-quoted words"]) from None

#!/usr/bin/env python3
"""Will the fabric carry the KV cache? Bytes per token from the model config versus the link speed.

Runs on an engine host from `runs/deployment-tools/fabric_budget.py` with the Python standard library only.

  standard attention: layers x 2 (K and V) x KV heads x head dim x dtype bytes
  MLA (kv_lora_rank): layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes

KV heads are split over tensor-parallel ranks (at least one per rank, replicated when there are fewer
heads than ranks); the MLA latent is replicated on every rank. One prefill-to-decode host edge carries
every rank's share, so

  Gbit/s = edge bytes/token x prompt tokens per handoff x handoffs/s x burst x headroom x 8 / 1e9

Exit 0 when the link is fast enough, 1 when it is too slow, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

EXIT_TOO_SLOW = 1
EXIT_USAGE = 2
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1,
}


class BudgetError(Exception):
    """Input the calculation cannot use; the message names the file, key or option."""


def kv_cache_shape(config: Mapping[str, Any], dtype_bytes: int, tensor_parallel: int) -> dict[str, Any]:
    """Bytes per token for the whole model, per TP rank, and over one host edge."""
    config = _text_config(config)
    layers = _positive(config, "num_hidden_layers")
    if config.get("kv_lora_rank"):
        per_layer = _positive(config, "kv_lora_rank") + _positive(config, "qk_rope_head_dim")
        total = layers * per_layer * dtype_bytes
        return _shape("mla", layers, total, total, tensor_parallel)
    heads = _positive(config, "num_attention_heads")
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or _positive(config, "hidden_size") // heads)
    total = layers * 2 * kv_heads * head_dim * dtype_bytes
    per_rank = layers * 2 * max(1, kv_heads // tensor_parallel) * head_dim * dtype_bytes
    return _shape("standard", layers, total, per_rank, tensor_parallel)


def required_gbps(edge_bytes_per_token: int, prompt_tokens: int, handoffs_per_s: float, burst: float,
                  headroom: float) -> float:
    return edge_bytes_per_token * prompt_tokens * handoffs_per_s * burst * headroom * 8 / 1e9


def link_gbps(interface: str | None, sys_class_net: Path, measured: float | None) -> tuple[float, str]:
    """The measured figure when given, else `/sys/class/net/<if>/speed` (Mbit/s)."""
    if measured is not None:
        return measured, "--measured-gbps"
    if not interface:
        raise BudgetError("no interface: pass --interface or set NARWHAL_FABRIC_INTERFACE (or --measured-gbps)")
    path = sys_class_net / interface / "speed"
    try:
        mbps = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        mbps = -1
    if mbps <= 0:
        raise BudgetError(f"{path}: link speed unknown; pass --measured-gbps")
    return mbps / 1000, str(path)


def dtype_bytes(config: Mapping[str, Any], kv_cache_dtype: str) -> int:
    """The KV-cache element size: the cache dtype when set, else the model dtype."""
    model_dtype = _text_config(config).get("torch_dtype") or config.get("torch_dtype") or config.get("dtype")
    name = model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    if name not in DTYPE_BYTES:
        raise BudgetError(f"unknown KV-cache dtype {name!r}; pass --kv-cache-dtype (one of {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[name]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _load_config(args.model_config)
        shape = kv_cache_shape(config, dtype_bytes(config, args.kv_cache_dtype), args.tensor_parallel)
        link, link_source = link_gbps(args.interface, args.sys_class_net, args.measured_gbps)
    except BudgetError as exc:
        print(f"fabric_budget: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    need = required_gbps(shape["edge_bytes_per_token"], args.prompt_tokens, args.handoffs_per_s, args.burst,
                         args.headroom)
    result = {**shape, "prompt_tokens": args.prompt_tokens, "handoffs_per_s": args.handoffs_per_s,
              "burst": args.burst, "headroom": args.headroom, "required_gbps": need, "link_gbps": link,
              "link_source": link_source, "ok": need <= link}
    print(json.dumps(result, indent=2) if args.json else _summary(result))
    return 0 if result["ok"] else EXIT_TOO_SLOW


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabric_budget.py", description=__doc__.splitlines()[0])
    model_dir = os.environ.get("NARWHAL_MODEL_DIR")
    parser.add_argument("--model-config", type=Path, default=Path(model_dir) / "config.json" if model_dir else None,
                        help="the model's config.json (default: $NARWHAL_MODEL_DIR/config.json)")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="TP ranks per engine (default 1)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (model dtype), fp8, bfloat16, ...")
    parser.add_argument("--prompt-tokens", type=int, required=True, help="prompt tokens per prefill handoff")
    parser.add_argument("--handoffs-per-s", type=float, required=True, help="handoffs per second on the edge")
    parser.add_argument("--burst", type=float, default=1.0, help="peak-to-mean factor (default 1.0)")
    parser.add_argument("--headroom", type=float, default=1.25, help="safety factor (default 1.25)")
    parser.add_argument("--interface", default=os.environ.get("NARWHAL_FABRIC_INTERFACE"),
                        help="fabric interface (default: $NARWHAL_FABRIC_INTERFACE)")
    parser.add_argument("--measured-gbps", type=float, default=None, help="measured link Gbit/s (skips sysfs)")
    parser.add_argument("--sys-class-net", type=Path, default=Path("/sys/class/net"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def _load_config(path: Path | None) -> Mapping[str, Any]:
    if path is None:
        raise BudgetError("no model config: pass --model-config or set NARWHAL_MODEL_DIR")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BudgetError(f"{path}: not a readable JSON model config ({type(exc).__name__})") from None
    if not isinstance(config, dict):
        raise BudgetError(f"{path}: not a JSON object")
    return config


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal checkpoints nest the language model's shape under `text_config`."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and "num_hidden_layers" not in config else config


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BudgetError(f"model config: {key} must be a positive integer")
    return value


def _shape(kind: str, layers: int, total: int, per_rank: int, tensor_parallel: int) -> dict[str, Any]:
    if tensor_parallel < 1:
        raise BudgetError("--tensor-parallel must be at least 1")
    return {"attention": kind, "layers": layers, "tensor_parallel": tensor_parallel, "bytes_per_token": total,
            "bytes_per_token_per_rank": per_rank, "edge_bytes_per_token": per_rank * tensor_parallel}


def _summary(result: Mapping[str, Any]) -> str:
    verdict = "ok" if result["ok"] else "TOO SLOW"
    return (f"{verdict}: need {result['required_gbps']:.2f} Gbit/s, link {result['link_gbps']:.2f} Gbit/s "
            f"({result['link_source']}); KV cache {result['bytes_per_token']} B/token, "
            f"{result['bytes_per_token_per_rank']} B/token per rank ({result['attention']}, "
            f"{result['layers']} layers, TP {result['tensor_parallel']})")


if __name__ == "__main__":
    sys.exit(main())

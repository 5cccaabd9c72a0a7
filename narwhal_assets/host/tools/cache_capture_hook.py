#!/usr/bin/env python3
"""Record the serving engine's resolved KV-cache layout, from inside the engine, as a private JSON file.

Mounted into the engine container as `sitecustomize.py` (on `PYTHONPATH`), so every Python process of the
engine, its spawned workers included, imports it at start-up. It does nothing unless
`NARWHAL_CAPTURE_CACHE=1`. Then a `sys.meta_path` finder waits for
`vllm.v1.worker.gpu_model_runner` to be imported and wraps `GPUModelRunner.initialize_kv_cache`: after the
real method has allocated the cache, the layout (blocks, block size, dtype, layers, tensor shape) is written
0600 to `NARWHAL_CACHE_CAPTURE_PATH` (`{pid}` is replaced by the process id; default
`$NARWHAL_RUN_DIR/cache-capture/kv-cache-{pid}.json`). A failure to record is reported on stderr and never
breaks the engine. Standard library only.
"""

from __future__ import annotations

import argparse
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGET_MODULE = "vllm.v1.worker.gpu_model_runner"
TARGET_CLASS = "GPUModelRunner"
TARGET_METHOD = "initialize_kv_cache"
SCHEMA = "narwhal.kv-cache-capture"
_PATCHED = "_narwhal_cache_capture"


def enabled() -> bool:
    return os.environ.get("NARWHAL_CAPTURE_CACHE") == "1"


def capture_path() -> Path | None:
    """Where this process records its layout, or None when neither variable says."""
    template = os.environ.get("NARWHAL_CACHE_CAPTURE_PATH")
    if not template and os.environ.get("NARWHAL_RUN_DIR"):
        template = str(Path(os.environ["NARWHAL_RUN_DIR"]) / "cache-capture" / "kv-cache-{pid}.json")
    return Path(template.replace("{pid}", str(os.getpid()))) if template else None


class _Finder(importlib.abc.MetaPathFinder):
    """Lets the real finders locate the target module, then patches it right after it executes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if finder is not self and find else None
            )
            if spec is not None and spec.loader is not None:
                _wrap_exec(spec.loader)
                return spec
        return None


def _wrap_exec(loader: Any) -> None:
    original = loader.exec_module

    def exec_module(module: Any) -> None:
        original(module)
        patch_module(module)

    loader.exec_module = exec_module


def patch_module(module: Any) -> bool:
    """Wrap the runner's `initialize_kv_cache` once; False when the module has no such method."""
    runner = getattr(module, TARGET_CLASS, None)
    method = getattr(runner, TARGET_METHOD, None)
    if method is None or getattr(method, _PATCHED, False):
        return False

    @functools.wraps(method)
    def initialize_kv_cache(self: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, kv_cache_config, *args, **kwargs)
        try:
            record(describe(self, kv_cache_config))
        except Exception as exc:  # recording must never take the engine down
            print(f"narwhal cache capture: not recorded ({type(exc).__name__}: {exc})", file=sys.stderr)
        return result

    setattr(initialize_kv_cache, _PATCHED, True)
    setattr(runner, TARGET_METHOD, initialize_kv_cache)
    return True


def describe(runner: Any, kv_cache_config: Any) -> dict[str, Any]:
    """The resolved layout: vLLM's KVCacheConfig plus the shape and dtype of the allocated tensors."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    specs = [getattr(g, "kv_cache_spec", None) for g in groups]
    spec = next((s for s in specs if s is not None), None)
    tensors = _tensors(getattr(runner, "kv_caches", None))
    layer_names = [name for g in groups for name in (getattr(g, "layer_names", None) or [])]
    return {
        "schema": SCHEMA,
        "schema_version": 1,
        "pid": os.getpid(),
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "num_blocks": _int(getattr(kv_cache_config, "num_blocks", None)),
        "block_size": _int(getattr(spec, "block_size", None)),
        "dtype": _text(getattr(spec, "dtype", None)) or (_text(tensors[0].dtype) if tensors else None),
        "num_kv_heads": _int(getattr(spec, "num_kv_heads", None)),
        "head_size": _int(getattr(spec, "head_size", None)),
        "layers": len(layer_names) or len(tensors),
        "shape": [int(d) for d in tensors[0].shape] if tensors else None,
        "tensors": len(tensors),
        "groups": [{"spec": type(s).__name__, "layers": len(getattr(g, "layer_names", None) or [])}
                   for g, s in zip(groups, specs, strict=True)],
    }


def record(layout: dict[str, Any]) -> Path | None:
    """Write the layout atomically at mode 0600 (directory 0700)."""
    path = capture_path()
    if path is None:
        print("narwhal cache capture: set NARWHAL_CACHE_CAPTURE_PATH or NARWHAL_RUN_DIR", file=sys.stderr)
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(layout, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def install() -> bool:
    """Activate the hook when `NARWHAL_CAPTURE_CACHE=1`; patch at once if the module is already loaded."""
    if not enabled():
        return False
    if TARGET_MODULE in sys.modules:
        patch_module(sys.modules[TARGET_MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """`show`: what the hook would do in this environment (it records nothing itself)."""
    parser = argparse.ArgumentParser(prog="cache_capture_hook.py", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("show",))
    parser.parse_args(argv)
    path = capture_path()
    print(json.dumps({"enabled": enabled(), "hook": f"{TARGET_MODULE}.{TARGET_CLASS}.{TARGET_METHOD}",
                      "path": str(path) if path else None}, indent=2))
    return 0


def _tensors(caches: Any) -> list[Any]:
    values = caches.values() if isinstance(caches, dict) else caches if isinstance(caches, list | tuple) else []
    return [t for t in values if hasattr(t, "shape")]


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
else:
    install()

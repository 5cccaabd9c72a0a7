"""The serving fleet's readers, restated as rules: what each of its programs requires of a file it reads.

Written from the public format of the Narwhal repository's readers (the router's fleet loader, the profiler's
limits loader, the host-access inventory loader, the role-environment exporter, the engine-launch record
selector and the engine launcher), in this project's words: each function returns the list of rules a
document breaks, empty when the fleet's reader would accept it. The contract tests run them on what
discovery and prepare generate, so a field that drifts from the fleet's format fails here first.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
REFERENCE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PINNED_IMAGE_RE = re.compile(r"(?:sha256:|\S+@sha256:)[0-9a-f]{64}")
REVISION_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
ENGINE_ROLE_RE = re.compile(r"engine-[1-9][0-9]*")
HOST_ID_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")

# --- the inventory (host access loader) ----------------------------------------------------------------------


def inventory_problems(document: Any, env: Mapping[str, str]) -> list[str]:
    """Unique lowercase ids, named access variables that are set, distinct destinations, every role owned once,
    a router and at least one engine."""
    problems: list[str] = []
    ids: set[str] = set()
    destinations: set[str] = set()
    roles: set[str] = set()
    for entry in document["hosts"]:
        host = entry.get("id")
        if not isinstance(host, str) or not HOST_ID_RE.fullmatch(host) or host in ids:
            problems.append(f"host id {host!r}: not a unique lowercase name")
        if not entry.get("roles"):
            problems.append(f"{host}: no role")
        for name in (entry.get("ssh_env"), entry.get("password_env")):
            if name is not None and (not NAME_RE.fullmatch(name) or not env.get(name)):
                problems.append(f"{host}: access variable {name} is not a set variable name")
        destination = env.get(entry.get("ssh_env") or "", "")
        if destination.startswith("-") or any(c.isspace() for c in destination):
            problems.append(f"{host}: destination is not an alias or user@host")
        if destination in destinations:
            problems.append(f"{host}: shares its destination with another entry")
        for role in entry.get("roles", []):
            if not (role == "router" or ENGINE_ROLE_RE.fullmatch(role)) or role in roles:
                problems.append(f"{host}: role {role!r} is not a router or engine role owned once")
            roles.add(role)
        ids.add(host)
        destinations.add(destination)
    if "router" not in roles or not any(r.startswith("engine-") for r in roles):
        problems.append("no router or no engine")
    return problems


# --- the fleet (router's loader) ---------------------------------------------------------------------------------

FLEET_KEYS = {"schema", "schema_version", "model", "engines", "slo", "controller", "serving", "engine", "recovery",
              "profiles", "engine_contract", "hardware"}  # fmt: skip
SECTION_KEYS = {
    "slo": {"ttft_s", "tpot_s"},
    "controller": {"monitor_interval_s", "monitor_failure_limit", "advisory", "min_prefill", "min_decode",
                   "flip_history", "thresholds", "reactive"},
    "profiles": {"path", "max_decode_fit_mape", "max_decode_cv_mape"},
    "engine": {"backend", "connector", "dialect", "tokenize", "chars_per_token", "tokenize_timeout_s",
               "engine_api_key_env", "control_connections", "pool_timeout_s", "connect_timeout_s",
               "health_timeout_s", "decode_read_timeout_s", "first_token_timeout_s", "first_token_calibration_path"},
    "hardware": {"accelerator", "accelerators_per_engine", "tensor_parallel"},
}  # fmt: skip
THRESHOLD_KEYS = {"expand", "shrink", "cooldown_s", "sustained_intervals", "dwell_s", "panic_ratio",
                  "flip_resident_guard"}  # fmt: skip
ENGINE_SPEC_KEYS = {"iid", "url", "role", "pin", "attestation_url", "shared_device"}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _endpoint(field: str, value: Any, env: Mapping[str, str]) -> list[str]:
    """An endpoint is literal, or a whole `${VAR}` reference to a set variable holding no other reference."""
    if not isinstance(value, str):
        return [f"{field} is not a string"]
    if "${" not in value:
        return []
    match = REFERENCE_RE.fullmatch(value)
    if match is None:
        return [f"{field} is not a whole-value reference"]
    resolved = env.get(match.group(1), "")
    if not resolved.strip() or "${" in resolved:
        return [f"{field}: {match.group(1)} is unset, empty or another reference"]
    return []


def fleet_problems(document: Any, env: Mapping[str, str]) -> list[str]:
    """Schema `narwhal.fleet` 1, known keys only, model, engines and slo present, each engine an iid, a
    resolvable url (and attestation_url), a prefill or decode role, unique iids, finite numbers."""
    if document.get("schema") != "narwhal.fleet" or document.get("schema_version") != 1:
        return ["schema is not narwhal.fleet version 1"]
    problems = [f"unknown key {key}" for key in document if key not in FLEET_KEYS and not key.startswith("_")]
    problems += [f"missing {key}" for key in ("model", "engines", "slo") if key not in document]
    for section, known in SECTION_KEYS.items():
        problems += [f"unknown {section} key {key}" for key in document.get(section) or {} if key not in known]
    thresholds = (document.get("controller") or {}).get("thresholds") or {}
    problems += [f"unknown threshold {key}" for key in thresholds if key not in THRESHOLD_KEYS]
    problems += [f"{key} is not a number" for key, value in {**document.get("slo", {}), **thresholds}.items()
                 if not _number(value)]  # fmt: skip
    hardware = document.get("hardware") or {}
    if hardware and not (isinstance(hardware.get("accelerator"), str) and _integer(hardware.get(
            "accelerators_per_engine")) and _integer(hardware.get("tensor_parallel"))):  # fmt: skip
        problems.append("hardware fields have the wrong types")
    if not isinstance(document.get("model"), str):
        problems.append("model is not a string")
    engines = document.get("engines") or []
    iids = []
    for index, engine in enumerate(engines):
        where = f"engines[{index}]"
        problems += [f"{where}: unknown key {key}" for key in engine if key not in ENGINE_SPEC_KEYS]
        if "iid" not in engine or "url" not in engine:
            problems.append(f"{where}: iid or url missing")
            continue
        iids.append(engine["iid"])
        problems += _endpoint(f"{where}.url", engine["url"], env)
        problems += _endpoint(f"{where}.attestation_url", engine.get("attestation_url", ""), env)
        if engine.get("role", "decode") not in ("prefill", "decode"):
            problems.append(f"{where}: role is neither prefill nor decode")
    if not engines or len(set(iids)) != len(iids):
        problems.append("no engines, or a repeated iid")
    return problems


# --- profiling limits (profiler's loader) and where they come from ----------------------------------------------


def profiling_limits_problems(document: Any, fleet_iids: set[str], launches: Mapping[str, Any]) -> list[str]:
    """Schema `narwhal.profiling-limits` 1, exactly the fleet's iids, each a positive int: the one
    `--max-num-seqs` of that engine's launch record `runtime.extra_args`."""
    if document.get("schema") != "narwhal.profiling-limits" or document.get("schema_version") != 1:
        return ["schema is not narwhal.profiling-limits version 1"]
    limits = document.get("engines")
    if not isinstance(limits, dict) or set(limits) != fleet_iids:
        return ["engines do not name exactly the fleet's iids"]
    problems = [f"{iid}: not a positive int" for iid, v in limits.items() if type(v) is not int or v < 1]
    for role, record in launches.items():
        args = record.get("runtime", {}).get("extra_args", [])
        found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--max-num-seqs"]
        found += [a.partition("=")[2] for a in args if isinstance(a, str) and a.startswith("--max-num-seqs=")]
        iid = "n" + role.removeprefix("engine-")
        if len(found) != 1 or not str(found[0]).isdigit() or int(found[0]) != limits.get(iid):
            problems.append(f"{role}: runtime.extra_args has no single --max-num-seqs equal to the limit")
    return problems


# --- launch records (the record selector and the launcher's runtime check) --------------------------------------

VALUE_OPTIONS = {"--max-model-len", "--gpu-memory-utilization", "--max-num-batched-tokens", "--max-num-seqs",
                 "--reasoning-parser", "--attention-backend"}  # fmt: skip
FLAG_OPTIONS = {"--trust-remote-code", "--language-model-only", "--enforce-eager", "--async-scheduling",
                "--no-disable-hybrid-kv-cache-manager", "--disable-hybrid-kv-cache-manager"}  # fmt: skip
LAUNCHER_ENV = {"ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "UCX_NET_DEVICES", "UCX_TLS", "UCX_TCP_PORT_RANGE",
                "NIXL_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_API_KEY"}
ENV_PREFIXES = ("VLLM_", "UCX_", "NIXL_", "ROCM_", "HIP_", "HSA_", "AITER_", "PYTORCH_", "SAFETENSORS_")
REFUSED_ENV_WORDS = ("PASSWORD", "TOKEN", "SECRET", "API_KEY", "SSH", "SKIP_COMPAT")


def runtime_problems(runtime: Any) -> list[str]:
    """Pinned vllm and nixl versions, a two-byte dtype with an auto KV cache, a positive block size, extra
    arguments the launcher knows (value options with their value), an environment of engine-prefixed names
    it does not manage, no credential-like or compatibility-skipping name, one-line values."""
    problems = []
    packages = runtime.get("expected_packages", {})
    if not isinstance(packages, dict) or not packages.get("vllm") or not any(
            n in packages for n in ("nixl", "nixl-rocm")):  # fmt: skip
        return ["runtime.expected_packages does not pin vllm and nixl"]
    if any(not isinstance(v, str) or not v or "<" in v for v in packages.values()):
        problems.append("runtime.expected_packages holds an unresolved version")
    if runtime.get("model_dtype") not in ("bfloat16", "float16") or runtime.get("kv_cache_dtype") != "auto":
        problems.append("runtime dtypes are not a two-byte model dtype with kv_cache_dtype auto")
    if type(runtime.get("block_size")) is not int or runtime["block_size"] < 1:
        problems.append("runtime.block_size is not positive")
    args = runtime.get("extra_args", [])
    if not isinstance(args, list) or any(not isinstance(a, str) for a in args):
        return [*problems, "runtime.extra_args is not a list of strings"]
    index = 0
    while index < len(args):
        if args[index] in VALUE_OPTIONS and index + 1 < len(args) and not args[index + 1].startswith("--"):
            index += 2
        elif args[index] in FLAG_OPTIONS:
            index += 1
        else:
            problems.append(f"runtime.extra_args: {args[index]} is not an option the launcher accepts")
            index += 1
    for name, value in runtime.get("environment", {}).items():
        if (not NAME_RE.fullmatch(name) or name in LAUNCHER_ENV or not name.startswith(ENV_PREFIXES)
                or any(word in name for word in REFUSED_ENV_WORDS) or not isinstance(value, str)
                or any(c in value for c in "\r\n\0")):  # fmt: skip
            problems.append(f"runtime.environment: {name} is not a field the launcher accepts")
    return problems


def _device_paths(paths: Any) -> bool:
    return isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/dev/") and ".." not in
                                           PurePosixPath(p).parts for p in paths)  # fmt: skip


def launch_record_problems(document: Any, role: str, env: Mapping[str, str]) -> list[str]:
    """`engine-launch.local.json` as the fleet's selector reads engine `role` from it."""
    if document.get("schema") != "narwhal.engine-launch" or document.get("schema_version") != 1:
        return ["schema is not narwhal.engine-launch version 1"]
    entry = document.get("engines", {}).get(role)
    if entry is None:
        return [f"no allocation for {role}"]
    problems = []
    name = entry.get("accelerator")
    if not isinstance(name, str) or not name.strip() or "<" in name:
        problems.append("accelerator is not a product name")
    gpus = entry.get("gpu_ids")
    if (not isinstance(gpus, list) or not gpus or len(set(map(str, gpus))) != len(gpus)
            or any(not isinstance(g, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", g) for g in gpus)):  # fmt: skip
        problems.append("gpu_ids are not distinct index or UUID strings")
        gpus = []
    tp = entry.get("tensor_parallel_size")
    if type(tp) is not int or not 1 <= tp <= max(len(gpus), 1):
        problems.append("tensor_parallel_size does not fit the allocation")
    visibility = entry.get("gpu_visibility_env")
    if visibility not in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        problems.append("gpu_visibility_env is not a GPU visibility variable")
    transfer = entry.get("transfer", {})
    transport = transfer.get("transport")
    if transport not in ("ucx_tcp", "ucx_rdma"):
        problems.append("transfer.transport is neither ucx_tcp nor ucx_rdma")
    allowed_tls = {"cuda", "cuda_copy"} if visibility == "CUDA_VISIBLE_DEVICES" else {"rocm"}
    tls = transfer.get("gpu_tls", "cuda" if visibility == "CUDA_VISIBLE_DEVICES" else "rocm")
    if not isinstance(tls, str) or tls not in allowed_tls:
        problems.append("transfer.gpu_tls is not one GPU transport of the runtime")
    net = transfer.get("net_devices", "")
    reference = REFERENCE_RE.fullmatch(net) if isinstance(net, str) else None
    if reference:
        net = env.get("NARWHAL_FABRIC_INTERFACE", "") if reference.group(1) == "NARWHAL_FABRIC_INTERFACE" else ""
    if not isinstance(net, str) or not re.fullmatch(r"[A-Za-z0-9_.:,-]+", net):
        problems.append("transfer.net_devices names no UCX device")
    elif (transport == "ucx_tcp") == (":" in net):
        problems.append("transfer.net_devices does not fit the transport (interfaces for TCP, HCA:port for RDMA)")
    for field, paths in (("accelerator_devices", entry.get("accelerator_devices")),
                         ("transfer.devices", transfer.get("devices"))):  # fmt: skip
        if not _device_paths(paths):
            problems.append(f"{field} are not device paths under /dev")
    if transport == "ucx_rdma" and not transfer.get("devices"):
        problems.append("ucx_rdma without RDMA device mappings")
    if entry.get("network_mode") != "host":
        problems.append("network_mode is not host")
    sources = entry.get("sources", {})
    if not isinstance(sources, dict) or any(not isinstance(sources.get(f), str) or not sources[f].strip()
                                            for f in ("allocation", "devices", "transfer")):  # fmt: skip
        problems.append("sources do not name the allocation, devices and transfer")
    if "runtime" in entry:
        problems += runtime_problems(entry["runtime"])
    return problems


def launcher_problems(record: Any, env: Mapping[str, str]) -> list[str]:
    """`engine-launch.engine-<n>.json` and the engine role environment, as the launcher builds a container
    from them: a record the selector produced (its resolved `environment`), a numbered engine role, a pinned
    image, three distinct valid ports, the engine's fabric address and an HTTP URL on its engine port."""
    role = record.get("role")
    if not isinstance(role, str) or not ENGINE_ROLE_RE.fullmatch(role):
        return ["role is not an engine role"]
    if record.get("schema") != "narwhal.engine-launch" or record.get("schema_version") != 1:
        return ["schema is not narwhal.engine-launch version 1"]
    problems = launch_record_problems({"schema": "narwhal.engine-launch", "schema_version": 1,
                                       "engines": {role: record}}, role, env)  # fmt: skip
    visibility = record.get("gpu_visibility_env")
    environment = record.get("environment", {})
    own = ",".join(record.get("gpu_ids", []))
    if not str(environment.get(visibility, "")).startswith(own) or "UCX_NET_DEVICES" not in environment:
        problems.append("environment does not resolve the GPU visibility and UCX devices")
    if not PINNED_IMAGE_RE.fullmatch(env.get("NARWHAL_ENGINE_IMAGE", "")):
        problems.append("NARWHAL_ENGINE_IMAGE is not an immutable id or digest")
    try:
        ports = [int(env[f"NARWHAL_{name}"]) for name in ("ENGINE_PORT", "NIXL_SIDE_CHANNEL_PORT", "ATTEST_PORT")]
    except (KeyError, ValueError):
        return [*problems, "the engine, NIXL side-channel and attestation ports are not all set"]
    if any(not 1 <= p <= 65535 for p in ports) or len(set(ports)) != 3:
        problems.append("engine, attestation and NIXL ports are not distinct valid ports")
    node = role.split("-")[1]
    if not env.get(f"NARWHAL_NODE_{node}_IP"):
        problems.append(f"NARWHAL_NODE_{node}_IP is not set")
    endpoint = urlsplit(env.get(f"NARWHAL_NODE_{node}_URL", ""))
    if endpoint.scheme != "http" or not endpoint.hostname or endpoint.port != ports[0]:
        problems.append(f"NARWHAL_NODE_{node}_URL is not an HTTP URL on NARWHAL_ENGINE_PORT")
    for name in ("NARWHAL_UCX_TCP_PORT_RANGE", "NARWHAL_MODEL_DIR", "NARWHAL_ENGINE_MODEL_NAME",
                 "NARWHAL_DEPLOYMENT_REVISION", "NARWHAL_MODEL_CONFIG_SHA256", "NARWHAL_CACHE_CAPTURE_HOOK",
                 "NARWHAL_CACHE_CAPTURE_HOOK_SHA256", "NARWHAL_ENGINE_LAUNCH_CONFIG"):  # fmt: skip
        if not env.get(name):
            problems.append(f"{name} is not set")
    if "," in env.get("NARWHAL_MODEL_DIR", ""):
        problems.append("NARWHAL_MODEL_DIR holds a comma (a bind-mount path)")
    return problems


# --- role files (the role-environment exporter) -------------------------------------------------------------

ENGINE_FIELDS = ("ENGINE_IMAGE", "ENGINE_MODEL_NAME", "MODEL_DIR", "RUN_DIR", "MODEL_CONFIG_SHA256",
                 "FABRIC_INTERFACE", "ENGINE_PORT", "ATTEST_PORT", "NIXL_SIDE_CHANNEL_PORT", "UCX_TCP_PORT_RANGE")
ENGINE_TOOLS = {"NARWHAL_ENGINE_LAUNCHER": "runs/deployment-tools/launch_engine.py",
                "NARWHAL_CACHE_CAPTURE_HOOK": "runs/deployment-tools/cache_capture_hook.py",
                "NARWHAL_FABRIC_BUDGET_TOOL": "runs/deployment-tools/fabric_budget.py"}  # fmt: skip
TOOL_DIGESTS = ("NARWHAL_FABRIC_BUDGET_SHA256", "NARWHAL_ENGINE_LAUNCHER_SHA256", "NARWHAL_CACHE_CAPTURE_HOOK_SHA256")


def role_file_problems(values: Mapping[str, str], role: str, fleet: Any, nodes: list[int],
                       access: set[str]) -> list[str]:  # fmt: skip
    """A role file, as bash leaves it after sourcing: variable names only, none naming SSH or an inventory access
    variable, the full revision, the router's fleet path and every variable the fleet's endpoints reference,
    an engine's tools with their digests, its launch file, its ten fields, every node's fabric address and its
    own service URLs; the credential named by the fleet (also as NARWHAL_ENGINE_API_KEY on engines)."""
    problems = [f"{name}: not a deployment variable name" for name in values
                if not NAME_RE.fullmatch(name) or "SSH" in name or name in access]  # fmt: skip
    if not REVISION_RE.fullmatch(values.get("NARWHAL_DEPLOYMENT_REVISION", "")):
        problems.append("NARWHAL_DEPLOYMENT_REVISION is not a full commit id")
    key_name = (fleet.get("engine") or {}).get("engine_api_key_env")
    wanted = [key_name] if key_name else []
    if role == "router":
        if values.get("NARWHAL_FLEET") != "runs/deployment/fleet.json":
            problems.append("NARWHAL_FLEET is not runs/deployment/fleet.json")
        for engine in fleet["engines"]:
            for field in ("url", "attestation_url"):
                match = REFERENCE_RE.fullmatch(engine.get(field, ""))
                wanted += [match.group(1)] if match else []
    else:
        n = int(role.split("-")[1])
        problems += [f"{name} is not {path}" for name, path in ENGINE_TOOLS.items() if values.get(name) != path]
        problems += [f"{name} is not a SHA-256" for name in TOOL_DIGESTS
                     if not re.fullmatch(r"[0-9a-f]{64}", values.get(name, ""))]  # fmt: skip
        if values.get("NARWHAL_ENGINE_LAUNCH_CONFIG") != f"config/engine-launch.engine-{n}.json":
            problems.append("NARWHAL_ENGINE_LAUNCH_CONFIG is not the engine's launch file")
        wanted += [f"NARWHAL_{field}" for field in ENGINE_FIELDS]
        wanted += [f"NARWHAL_NODE_{m}_IP" for m in nodes]
        wanted += [f"NARWHAL_NODE_{n}_URL", f"NARWHAL_NODE_{n}_ATTESTATION_URL"]
        for m in nodes:
            try:
                ipaddress.ip_address(values.get(f"NARWHAL_NODE_{m}_IP", ""))
            except ValueError:
                problems.append(f"NARWHAL_NODE_{m}_IP is not an IP address")
        if key_name and values.get("NARWHAL_ENGINE_API_KEY") != values.get(key_name):
            problems.append("NARWHAL_ENGINE_API_KEY is not the configured credential")
    problems += [f"{name} is unset or empty" for name in wanted if not values.get(name)]
    return problems

"""The drift probe's protocol: the program sent to a host for what its latest observation says to re-read, and
the parse of the one JSON document it prints (bounded; tool failures become the snapshot's problems)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from narwhal_assets.core.discovery.drift import DriftSnapshot, FileStat, ModelStat, fabric_addresses
from narwhal_assets.core.discovery.observations import Gpu, HostObservation
from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import DriftProbeError
from narwhal_assets.host import program_call, program_source
from narwhal_assets.host.probe import IP_ARGV, NVIDIA_SMI_ARGV
from narwhal_assets.protocols.probe_report import parse_docker_inspect, parse_ip_json, parse_nvidia_smi

DRIFT_PROGRAM = "drift_probe.py"  # the host program's name, as the transport's messages show it
OUTPUT_LIMIT = 64 << 20
SCHEMA = "narwhal.drift-probe"


def drift_source() -> str:
    return program_source(DRIFT_PROGRAM)


def drift_script(observation: HostObservation) -> str:
    """The drift program for a host: what its latest observation says to re-read, as an ASCII JSON literal."""
    commands: dict[str, list[str]] = {"nvidia-smi": NVIDIA_SMI_ARGV, "ip": IP_ARGV}
    if observation.image is not None:
        commands["docker"] = ["docker", "image", "inspect", observation.image.reference]
    models = {engine: model.model_dir for engine, model in observation.models.items()}
    return program_call(drift_source(), "main", {"commands": commands, "models": models})


def parse_drift_output(
    host_id: str, fingerprint: str, raw: str, fabric: list[str], observation: HostObservation
) -> DriftSnapshot:
    """The snapshot of one host; tool failures become its `problems`, an unusable document an error."""
    try:
        doc = json.loads(raw) if len(raw) <= OUTPUT_LIMIT else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("schema_version") != 1:
        raise DriftProbeError(f"host {host_id}: drift probe output is not a {SCHEMA} document")
    tools = doc["tools"] if isinstance(doc.get("tools"), dict) else {}
    problems = [f"drift probe: {printable(str(e))}" for e in doc.get("errors") or []]
    gpus = _gpus(tools.get("nvidia-smi"), bool(observation.gpus), problems)
    interfaces, found = parse_ip_json(_stdout(tools.get("ip"), "ip -json address", problems), {})
    problems += found
    image_id = None
    if observation.image is not None:
        image, found = parse_docker_inspect(
            observation.image.reference, _stdout(tools.get("docker"), "docker image inspect", problems)
        )
        problems += found
        image_id = image.id if image else None
    return DriftSnapshot(
        host_id=host_id,
        host_key_fingerprint=fingerprint,
        machine_id=doc["machine_id"] if isinstance(doc.get("machine_id"), str) else None,
        image_id=image_id,
        gpus=gpus,
        fabric=fabric_addresses(interfaces, fabric),
        models=_models(doc.get("models"), problems),
        problems=problems,
    )


def _stdout(result: Any, label: str, problems: list[str]) -> str:
    """A tool's stdout, or "" with a problem when it did not run or failed."""
    if not isinstance(result, Mapping) or not isinstance(result.get("rc"), int):
        problems.append(f"{label}: no result")
        return ""
    if result["rc"] != 0:
        message = next(iter(str(result.get("stderr") or "").splitlines()), "")[:200]
        problems.append(f"{label}: exit {result['rc']}: {printable(message)}")
        return ""
    return str(result.get("stdout") or "")


def _gpus(result: Any, expected: bool, problems: list[str]) -> list[Gpu]:
    """GPUs; a failing nvidia-smi is drift only where discovery saw GPUs (a router-only host may have none)."""
    failed: list[str] = []
    stdout = _stdout(result, "nvidia-smi", failed)
    if failed:
        problems += failed if expected else []
        return []
    gpus, found = parse_nvidia_smi(stdout)
    problems += found
    return gpus


def _models(raw: Any, problems: list[str]) -> dict[str, ModelStat]:
    models: dict[str, ModelStat] = {}
    for engine, entry in (raw or {}).items() if isinstance(raw, dict) else ():
        try:
            files = {str(path): FileStat(size=s[0], mtime_ns=s[1], inode=s[2]) for path, s in entry["files"].items()}
            models[str(engine)] = ModelStat(
                model_dir=str(entry["model_dir"]),
                config_sha256=entry.get("config_sha256"),
                bytes_read=int(entry.get("bytes_read") or 0),
                files=files,
                problems=[str(p) for p in entry.get("problems") or []],
            )
        except (KeyError, TypeError, IndexError, ValueError):
            problems.append(f"drift probe: model {printable(str(engine))}: malformed entry")
    return models

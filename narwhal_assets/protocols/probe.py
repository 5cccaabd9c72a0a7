"""Programs sent to fleet hosts and the workstation-side code that builds their input and reads their output.

Discovery runs ONE probe program per physical host over one SSH connection: the transport runs
`probe_script(params)` in the host's guard (`HostConnection.run_program`) and hands the probe's stdout to
`narwhal_assets.protocols.probe_report.parse_probe_output`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from narwhal_assets.core.discovery.observations import CheckpointDigest
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.roles import engine_number
from narwhal_assets.host import program_call, program_source

PROBE_PROGRAM = "probe.py"  # the host program's name, as the transport's messages show it
PARAM_KEYS = frozenset({"image", "models", "previous", "full_hash", "workers", "sysfs_net", "sysfs_infiniband",
                        "dev_infiniband", "known_packages"})

__all__ = ["PROBE_PROGRAM", "previous_hashes", "probe_params", "probe_script", "probe_source"]


def probe_source() -> str:
    """The probe's source text, exactly as shipped in the package."""
    return program_source(PROBE_PROGRAM)


def _image_problems(image: Any) -> list[str]:
    if image is None:
        return []
    if not isinstance(image, str) or not image or image.startswith("-") or any(c.isspace() for c in image):
        return ["probe params: image must be an image reference without spaces, not starting with '-'"]
    return []


def _model_problems(models: Any) -> list[str]:
    if not isinstance(models, Mapping):
        return ["probe params: models must map engine roles to model directories"]
    problems = []
    for engine, model_dir in models.items():
        if not isinstance(engine, str) or engine_number(engine) is None:
            problems.append(f"probe params: models: {engine!r} is not an engine role (engine-<n>)")
        elif not isinstance(model_dir, str) or not model_dir.startswith("/") or "\n" in model_dir:
            problems.append(f"probe params: models.{engine}: the model directory must be an absolute path")
    return problems


def _other_problems(params: Mapping[str, Any]) -> list[str]:
    problems = [f"probe params: unknown key {key!r}" for key in sorted(set(params) - PARAM_KEYS)]
    workers = params.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        problems.append("probe params: workers must be a positive integer or null")
    if not isinstance(params.get("full_hash", False), bool):
        problems.append("probe params: full_hash must be true or false")
    if not isinstance(params.get("previous", {}), Mapping):
        problems.append("probe params: previous must map engine roles to {path: [size, mtime_ns, inode, sha256]}")
    known = params.get("known_packages", {})
    if not isinstance(known, Mapping) or not all(isinstance(v, Mapping) for v in known.values()):
        problems.append("probe params: known_packages must map image ids to {package: version}")
    return problems


def probe_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Check and complete probe parameters here, where a mistake is an InputError and not a remote failure."""
    problems = _image_problems(params.get("image"))
    problems += _model_problems(params.get("models", {}))
    problems += _other_problems(params)
    if problems:
        raise InputError(problems)
    checked: dict[str, Any] = {"image": None, "models": {}, "previous": {}, "full_hash": False, "workers": None}
    checked.update(params)
    return checked


def probe_script(params: Mapping[str, Any]) -> str:
    """The probe source plus a last line `main('<json>')` (`program_call`)."""
    return program_call(probe_source(), "main", probe_params(params))


def previous_hashes(digests: Mapping[str, CheckpointDigest]) -> dict[str, dict[str, list[int | str]]]:
    """The `previous` probe parameter from the last discovery's digests: per engine, path -> row.

    A row is `[size, mtime_ns, inode, sha256]`: no repeated key names, since a tree of many small files
    sends tens of thousands of them on every re-discovery.
    """
    return {
        engine: {f.path: [f.size, f.mtime_ns, f.inode, f.sha256] for f in digest.files}
        for engine, digest in digests.items()
    }

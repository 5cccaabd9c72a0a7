"""Fake GPU, image, RDMA and model data for simulated hosts, and the per-host tool scripts.

Everything here is deterministic in the host name, so a failing test shows the same UUIDs and ids on
every run. The output formats themselves live in `fake_nvidia_smi.py` and `fake_docker.py`; this module
only decides *what* each host has and writes the files that are bind-mounted on the host side.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_GPU_NAME = "NVIDIA H200"
DEFAULT_GPU_MEMORY_MIB = 143771
DEFAULT_IMAGE_REF = "narwhal/inference-engine:2025.11"
# What `importlib.metadata` finds inside the default engine image: the packages the launcher pins.
DEFAULT_PACKAGES = {"vllm": "0.11.0", "nixl": "0.6.1", "torch": "2.8.0"}
DRIVER_VERSION = "580.159.04"  # as on the H200 of tests/fixtures/h200-capture
CUDA_VERSION = "13.0"
# PCI bus ids of the eight GPUs on an HGX H200 baseboard, in nvidia-smi's spelling.
HGX_BUS_IDS = (
    "00000000:19:00.0", "00000000:3B:00.0", "00000000:4C:00.0", "00000000:5D:00.0",
    "00000000:9B:00.0", "00000000:BB:00.0", "00000000:CB:00.0", "00000000:DB:00.0",
)  # fmt: skip
# sysfs attribute files of one active NDR InfiniBand port, byte for byte.
IB_PORT_FILES = {"state": "4: ACTIVE\n", "link_layer": "InfiniBand\n", "rate": "400 Gb/sec (4X NDR)\n"}
UVERBS_MAJOR = 231  # ib_uverbs' character-device major; minors start at 192
RDMA_CM_MINOR = 58  # rdma_cm is a misc device (major 10); its minor is dynamic, 58 on a common kernel
TOOL_TEMPLATES = {"nvidia-smi": "fake_nvidia_smi.py", "docker": "fake_docker.py"}
_CONFIG_LINE_PREFIX = "CONFIG: dict[str, Any] = "


class FakeGpu(NamedTuple):
    """One GPU as nvidia-smi reports it: (index, uuid, name, memory MiB, PCI bus id)."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def gpu_uuid(host: str, index: int) -> str:
    """`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, stable per host name and index."""
    h = _digest("gpu", host, str(index))
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def bus_id(index: int) -> str:
    """Distinct bus ids: the HGX layout first, then made-up ones past eight GPUs."""
    return HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else f"00000000:{0xE0 + index:02X}:00.0"


def make_gpus(host: str, count: int, name: str, memory_mib: int) -> list[FakeGpu]:
    return [FakeGpu(i, gpu_uuid(host, i), name, memory_mib, bus_id(i)) for i in range(count)]


def default_image_id(image_ref: str) -> str:
    """A `sha256:` id derived from the image reference, so hosts given the same image agree by default."""
    return "sha256:" + _digest("image", image_ref)


def image_inspect_object(image_id: str, image_ref: str) -> dict[str, Any]:
    """One element of `docker image inspect` output (Docker 28 field order and types)."""
    repo = image_ref.rsplit(":", 1)[0] if ":" in image_ref.rsplit("/", 1)[-1] else image_ref
    hex_id = image_id.removeprefix("sha256:")
    return {
        "Id": image_id,
        "RepoTags": [image_ref],
        "RepoDigests": [f"{repo}@sha256:{_digest('manifest', hex_id)}"],
        "Parent": "",
        "Comment": "buildkit.dockerfile.v0",
        "Created": "2025-11-03T09:41:27.512093814Z",
        "DockerVersion": "",
        "Author": "",
        "Config": {
            "Env": ["PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/bin:/bin"],
            "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
            "Cmd": None,
            "WorkingDir": "/workspace",
            "Labels": {"org.opencontainers.image.ref.name": "ubuntu", "org.opencontainers.image.version": "24.04"},
        },
        "Architecture": "amd64",
        "Os": "linux",
        "Size": 21474836480 + int(hex_id[:6], 16),
        "GraphDriver": {"Data": None, "Name": "overlay2"},
        "RootFS": {"Type": "layers", "Layers": [f"sha256:{_digest('layer', hex_id, str(n))}" for n in range(3)]},
        "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
    }


def render_tool(tool: str, config: dict[str, Any]) -> str:
    """The fake tool's source with its CONFIG line replaced by this host's data."""
    source = (Path(__file__).parent / TOOL_TEMPLATES[tool]).read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(_CONFIG_LINE_PREFIX))
    # A Python literal (ASCII, every string escaped), not JSON text to decode: importing `json` would cost
    # each run of the tool more than the rest of its start-up.
    lines[index] = f"{_CONFIG_LINE_PREFIX}{config!a}\n"
    return "".join(lines)


def docker_config(images: list[dict[str, Any]], packages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The fake docker's CONFIG: the inspect objects, each one's `docker image inspect` JSON text, and the
    package versions installed in each image (default DEFAULT_PACKAGES)."""
    return {"images": images, "inspect_json": [json.dumps(image, indent=4, ensure_ascii=False) for image in images],
            "packages": packages if packages is not None else [dict(DEFAULT_PACKAGES) for _ in images]}  # fmt: skip


def write_tools(bin_dir: Path, gpus: list[FakeGpu], images: list[dict[str, Any]]) -> None:
    """Write executable `nvidia-smi` and `docker` for one host into its private bin directory."""
    configs: dict[str, dict[str, Any]] = {
        "nvidia-smi": {
            "gpus": [g._asdict() for g in gpus],
            "driver_version": DRIVER_VERSION,
            "cuda_version": CUDA_VERSION,
        },
        "docker": docker_config(images),
    }
    for tool, config in configs.items():
        path = bin_dir / tool
        path.write_text(render_tool(tool, config), encoding="utf-8")
        path.chmod(0o755)


def write_infiniband(root: Path, device: str = "mlx5_0", port: int = 1, verbs: int = 0) -> None:
    """A `/sys/class/infiniband` look-alike: `<device>/ports/<port>/{state,link_layer,rate}` and the HCA's
    verbs device `<device>/device/infiniband_verbs/uverbs<verbs>/{ibdev,dev,abi_version}`, as the kernel
    shows them (the dev number is the ib_uverbs major 231, minor 192 + N)."""
    port_dir = root / device / "ports" / str(port)
    port_dir.mkdir(parents=True, exist_ok=True)
    for name, content in IB_PORT_FILES.items():
        (port_dir / name).write_text(content, encoding="ascii")
    verbs_dir = root / device / "device" / "infiniband_verbs" / f"uverbs{verbs}"
    verbs_dir.mkdir(parents=True, exist_ok=True)
    attributes = {"ibdev": f"{device}\n", "dev": f"{UVERBS_MAJOR}:{192 + verbs}\n", "abi_version": "1\n"}
    for name, content in attributes.items():
        (verbs_dir / name).write_text(content, encoding="ascii")
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o444)


def write_rdma_devices(root: Path, verbs: int = 0) -> None:
    """A `/dev/infiniband` look-alike: the character devices `rdma_cm` (misc major 10) and `uverbs<verbs>`,
    mode 0666 like udev makes them. Nothing ever opens them here; their type and numbers are what a probe sees."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for name, (major, minor) in {"rdma_cm": (10, RDMA_CM_MINOR), f"uverbs{verbs}": (UVERBS_MAJOR, 192 + verbs)}.items():
        path = root / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)


def write_model(model_dir: Path, files: dict[str, bytes], config: dict[str, Any]) -> None:
    """`config.json` plus the given weight files, world-readable and root-owned like a shared model store."""
    model_dir.mkdir(parents=True, exist_ok=True)
    model_dir.chmod(0o755)
    contents = {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(), **files}
    for rel, data in contents.items():
        path = model_dir / rel
        if model_dir.resolve() not in path.resolve().parents:
            raise ValueError(f"model file {rel!r} escapes the model directory")
        for directory in reversed([p for p in path.parents if model_dir in p.parents]):
            directory.mkdir(exist_ok=True)
            directory.chmod(0o755)
        path.write_bytes(data)
        path.chmod(0o644)

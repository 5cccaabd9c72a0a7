"""Builders for the launch, fleet, deployment-env and profiling tests: settings layers, inventories and
host observations written out directly (no discovery run)."""

from __future__ import annotations

from pathlib import Path

from narwhal_assets.core.discovery.observations import (
    Gpu,
    HostObservation,
    ImageObservation,
    ModelObservation,
    NetAddress,
    NetInterface,
    RdmaPort,
)
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Layer, Settings

IMAGE_ID = "sha256:" + "a" * 64
CONFIG_SHA = "c" * 64
PACKAGES = {"nixl": "0.6.1", "torch": "2.8.0", "vllm": "0.11.0"}
H100 = "NVIDIA H100 80GB HBM3"
BASE_ENV = {
    "NARWHAL_ENGINE_IMAGE": IMAGE_ID,
    "NARWHAL_ENGINE_MODEL_NAME": "llama-3.1-8b",
    "NARWHAL_MODEL_DIR": "/models/llama",
    "NARWHAL_RUN_DIR": "runs/engine",
    "NARWHAL_MODEL_CONFIG_SHA256": CONFIG_SHA,
    "NARWHAL_FABRIC_INTERFACE": "eth1",
}


def make_settings(
    dotenv: dict[str, str] | None = None,
    process: dict[str, str] | None = None,
    discovered: dict[str, str] | None = None,
    base: dict[str, str] | None = None,
) -> Settings:
    """`base` (default BASE_ENV) goes into the .env layer under `dotenv`."""
    return Settings(
        root=Path("/nonexistent/checkout"),
        layers=(
            (Layer.DEFAULT, {}),
            (Layer.DISCOVERED, dict(discovered or {})),
            (Layer.DOTENV, {**(BASE_ENV if base is None else base), **(dotenv or {})}),
            (Layer.PROCESS, dict(process or {})),
        ),
    )


def gpu(index: int, name: str = H100) -> Gpu:
    return Gpu(index=index, uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000", name=name,
               memory_total_mib=81559, pci_bus_id=f"00000000:{index + 0x18:02X}:00.0")


def observation(
    host_id: str,
    roles: list[str],
    *,
    gpus: int | list[Gpu] = 2,
    addresses: list[tuple[str, str]] | None = None,
    interface: str = "eth1",
    rdma: list[RdmaPort] | None = None,
    rdma_devices: list[str] | None = None,
    image_id: str | None = IMAGE_ID,
    packages: dict[str, str] | None = None,
    config_sha: str = CONFIG_SHA,
    ip: str = "198.18.0.1",
) -> HostObservation:
    """One host's observation; `addresses` are (family, address) pairs on `interface`."""
    pairs = addresses if addresses is not None else [("inet", ip)]
    nets = [
        NetInterface(name="lo", state="UNKNOWN", addresses=[NetAddress(family="inet", address="127.0.0.1",
                                                                        prefixlen=8, scope="host")]),
        NetInterface(name=interface, state="UP", speed_mbps=100000,
                     addresses=[NetAddress(family=f, address=a, prefixlen=24 if f == "inet" else 64,
                                           scope="link" if a.startswith("fe80:") else "global")
                                for f, a in pairs]),
    ]
    engines = [r for r in roles if r.startswith("engine-")]
    return HostObservation(
        host_id=host_id,
        roles=roles,
        observed_at="2026-01-01T00:00:00Z",
        host_key_fingerprint="SHA256:" + "k" * 43,
        hostname=host_id,
        machine_id="m" * 32,
        boot_id="b" * 32,
        os_release="Debian GNU/Linux 12",
        kernel="6.1.0",
        python="3.11.7",
        gpus=[gpu(i) for i in range(gpus)] if isinstance(gpus, int) else gpus,
        interfaces=nets,
        rdma=rdma or [],
        rdma_devices=["rdma_cm", "uverbs0"] if rdma_devices is None and rdma else rdma_devices or [],
        image=None if image_id is None else ImageObservation(reference="vllm/vllm-openai:v0.10", id=image_id,
                                                             packages=PACKAGES if packages is None else packages),
        models={e: ModelObservation(model_dir="/models/llama", config_sha256=config_sha, tree_sha256="t" * 64,
                                    file_count=3) for e in engines},
    )


def rdma_port(state: str = "4: ACTIVE", netdevs: list[str] | None = None, device: str = "mlx5_0",
              verbs: list[str] | None = None) -> RdmaPort:  # fmt: skip
    """An RDMA port whose HCA's verbs device is `uverbs0` (present under /dev/infiniband unless told otherwise)."""
    return RdmaPort(device=device, port=1, state=state, link_layer="Ethernet", netdevs=netdevs or ["eth1"],
                    verbs=["uverbs0"] if verbs is None else verbs)  # fmt: skip


def two_hosts(**obs_kwargs: object) -> tuple[Inventory, dict[str, HostObservation]]:
    """router + engine-1 on node-1, engine-2 on node-2."""
    inventory = Inventory(hosts=[
        HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1"]),
        HostEntry(id="node-2", ssh_env="NARWHAL_NODE_2_SSH", roles=["engine-2"]),
    ])
    return inventory, {
        "node-1": observation("node-1", ["router", "engine-1"], ip="198.18.0.1", **obs_kwargs),  # type: ignore[arg-type]
        "node-2": observation("node-2", ["engine-2"], ip="198.18.0.2", **obs_kwargs),  # type: ignore[arg-type]
    }


def colocated() -> tuple[Inventory, dict[str, HostObservation]]:
    """engine-1 and engine-2 share node-1 (4 GPUs); engine-3 alone on node-3."""
    inventory = Inventory(hosts=[
        HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1", "engine-2"]),
        HostEntry(id="node-3", ssh_env="NARWHAL_NODE_3_SSH", roles=["engine-3"]),
    ])
    return inventory, {
        "node-1": observation("node-1", ["router", "engine-1", "engine-2"], gpus=4, ip="198.18.0.1"),
        "node-3": observation("node-3", ["engine-3"], gpus=2, ip="198.18.0.3"),
    }

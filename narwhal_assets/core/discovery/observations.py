"""What discovery observed on each physical host: the files under `runs/discovery/<run>/`.

Hostnames are labels only; identity is the SSH host key (recorded by fingerprint) and the machine id.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from narwhal_assets.core.records import Record


class Gpu(Record):
    """One row of `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id`."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    pci_bus_id: str


class NetAddress(Record):
    family: Literal["inet", "inet6"]
    address: str
    prefixlen: int
    scope: str = "global"


class NetInterface(Record):
    """One interface from `ip -json address`, with `/sys/class/net/<if>/speed` (Mbit/s; None if unknown)."""

    name: str
    state: str
    mac: str | None = None
    addresses: list[NetAddress] = Field(default_factory=list)
    speed_mbps: int | None = None


class RdmaPort(Record):
    """One port of `/sys/class/infiniband/<device>/ports/<port>`; `verbs` are its HCA's verbs devices
    (`<device>/device/infiniband_verbs/uverbs<N>`), named like their nodes under `/dev/infiniband/`."""

    device: str
    port: int
    state: str
    link_layer: str
    rate: str | None = None
    netdevs: list[str] = Field(default_factory=list)
    verbs: list[str] = Field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state.upper().endswith("ACTIVE")


class ImageObservation(Record):
    """`docker image inspect` of the configured engine image: its immutable id and repo digests, and the
    versions of the packages the serving fleet's launcher pins (vllm, nixl, ...), read inside the image."""

    reference: str
    id: str
    repo_digests: list[str] = Field(default_factory=list)
    packages: dict[str, str] = Field(default_factory=dict)


class CheckpointFile(Record):
    """One regular file of a model directory (symlinks followed); `path` is relative, POSIX."""

    path: str
    size: int
    sha256: str
    mtime_ns: int
    inode: int


class CheckpointDigest(Record):
    """`engine-<n>-checkpoint.json`: per-file hashes plus the tree digest (see README for its definition)."""

    schema_: Literal["narwhal.checkpoint"] = Field(default="narwhal.checkpoint", alias="schema")
    schema_version: Literal[1] = 1
    engine: str
    host_id: str
    model_dir: str
    files: list[CheckpointFile]
    tree_sha256: str
    # The serving fleet's digest of the same files (`core.discovery.digests.model_tree_digest`); None in
    # records written before it was recorded.
    model_tree_sha256: str | None = None
    bytes_hashed: int
    bytes_reused: int
    files_reused: int


class CheckpointFiles(Record):
    """`runs/discovery/objects/<sha256>.json`: one per-file table, named by the SHA-256 of its bytes.

    An unchanged tree yields the same table run after run, so it is stored once however many runs refer
    to it.
    """

    schema_: Literal["narwhal.checkpoint-files"] = Field(default="narwhal.checkpoint-files", alias="schema")
    schema_version: Literal[1] = 1
    files: list[CheckpointFile]


class CheckpointRecord(Record):
    """`engine-<n>-checkpoint.json` from schema version 2: a CheckpointDigest whose file table is referenced
    by `files_object` (the SHA-256 naming its CheckpointFiles object) instead of embedded."""

    schema_: Literal["narwhal.checkpoint"] = Field(default="narwhal.checkpoint", alias="schema")
    schema_version: Literal[2] = 2
    engine: str
    host_id: str
    model_dir: str
    tree_sha256: str
    model_tree_sha256: str | None = None
    file_count: int
    files_object: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes_hashed: int
    bytes_reused: int
    files_reused: int


class ModelObservation(Record):
    """An engine role's model directory: its config (hash and parsed content) and checkpoint summary."""

    model_dir: str
    config_sha256: str
    tree_sha256: str
    model_tree_sha256: str | None = None
    file_count: int
    config: dict[str, Any] = Field(default_factory=dict)


class HostObservation(Record):
    """`<host-id>.json` in the discovery run directory."""

    schema_: Literal["narwhal.host-observation"] = Field(default="narwhal.host-observation", alias="schema")
    schema_version: Literal[1] = 1
    host_id: str
    roles: list[str]
    observed_at: str
    host_key_fingerprint: str
    hostname: str
    machine_id: str
    boot_id: str
    os_release: str
    kernel: str
    python: str
    gpus: list[Gpu] = Field(default_factory=list)
    interfaces: list[NetInterface] = Field(default_factory=list)
    rdma: list[RdmaPort] = Field(default_factory=list)
    # Names of the character devices under /dev/infiniband (uverbs<N>, rdma_cm, ...).
    rdma_devices: list[str] = Field(default_factory=list)
    image: ImageObservation | None = None
    models: dict[str, ModelObservation] = Field(default_factory=dict)

    def interface(self, name: str) -> NetInterface | None:
        return next((i for i in self.interfaces if i.name == name), None)

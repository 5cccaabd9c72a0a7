"""Where an engine runs on its host: fabric address, GPU allocation and device nodes, UCX selection.

Everything here is derived from one host's observation, so messages name the host and the variable to
change.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from narwhal_assets.core.discovery.observations import Gpu, HostObservation, RdmaPort
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.launch.policy import Resolved
from narwhal_assets.core.records import Record

Transport = Literal["ucx_tcp", "ucx_rdma"]
GpuTls = Literal["cuda", "cuda_copy"]
TRANSPORTS: tuple[str, ...] = ("ucx_tcp", "ucx_rdma")
GPU_TLS: tuple[str, ...] = ("cuda", "cuda_copy")
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
RDMA_DEVICE_DIR = "/dev/infiniband"
RDMA_CM = "rdma_cm"
_NET_TLS = {"ucx_tcp": "tcp", "ucx_rdma": "rc"}


class Transfer(Record):
    """The resolved UCX selection of one engine (`transfer` in a launch record): the transport, the UCX network
    devices (an interface for TCP, `<HCA>:<port>` for RDMA), the character devices the container needs for it
    (RDMA's verbs and connection-manager nodes; none for TCP) and the one GPU transport."""

    transport: Transport
    net_devices: str
    devices: list[str]
    gpu_tls: GpuTls

    @property
    def ucx_tls(self) -> str:
        """`UCX_TLS` as the serving fleet's launcher sets it: network, shared memory, self, then the GPU."""
        return f"{_NET_TLS[self.transport]},sm,self,{self.gpu_tls}"


@dataclass(frozen=True)
class GpuAllocation:
    """The GPUs an engine owns: the observed rows, in the order the operator named them."""

    gpus: tuple[Gpu, ...]

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(g.index for g in self.gpus)

    @property
    def ids(self) -> list[str]:
        """`gpu_ids` of the launch record: nvidia-smi indices as strings. A UUID the operator wrote is resolved
        to its index, because vLLM reads `CUDA_VISIBLE_DEVICES` entries as integers."""
        return [str(g.index) for g in self.gpus]

    def device_paths(self) -> list[str]:
        """Host device nodes the container runtime maps for these GPUs (index = device minor)."""
        return [f"/dev/nvidia{g.index}" for g in self.gpus] + list(CONTROL_DEVICES)


def fabric_address(
    observation: HostObservation, interface: str, variable: str, n: int, selection: tuple[str, str] | None = None
) -> str:
    """Engine `n`'s fabric IP: the one global address of `interface`, or `selection` (the operator's
    `NARWHAL_NODE_<n>_IP` and its variable), which must be one of them. Two or more global addresses and no
    selection is refused, not resolved by taking the first: NIXL would advertise whichever was picked."""
    found = observation.interface(interface)
    host = observation.host_id
    if found is None:
        known = ", ".join(i.name for i in observation.interfaces) or "none"
        raise InputError([f"host {host}: fabric interface {interface!r} ({variable}) not found "
                          f"(observed interfaces: {known})"])
    candidates = list(dict.fromkeys(a.address for a in found.addresses if a.scope == "global" and _routable(a.address)))
    if selection is not None:
        return _selected_address(host, interface, candidates, *selection)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise InputError([f"host {host}: fabric interface {interface!r} ({variable}) has no global IPv4 or IPv6 "
                          "address"])
    raise InputError([f"host {host}: fabric interface {interface!r} ({variable}) has {len(candidates)} global "
                      f"addresses ({', '.join(candidates)}); set NARWHAL_NODE_{n}_IP to the one NIXL should use"])


def _selected_address(host: str, interface: str, candidates: list[str], value: str, name: str) -> str:
    try:
        canonical = str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError([f"{name} must be an IP address of host {host}'s fabric interface {interface!r}"]) from None
    if canonical != value:
        raise InputError([f"{name} must be written as {canonical}"])
    if value not in candidates:
        shown = ", ".join(candidates) or "none"
        raise InputError([f"{name} is not a global address of host {host}'s fabric interface {interface!r} "
                          f"(observed: {shown}); set it to one of them or remove it"])
    return value


def _routable(address: str) -> bool:
    """Scope says global, but a link-local or loopback address still cannot carry cross-host transfer."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return not (parsed.is_link_local or parsed.is_loopback or parsed.is_unspecified)


def http_url(address: str, port: int, path: str = "") -> str:
    """`http://IP:PORT/path`, with an IPv6 address in brackets."""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"http://{host}:{port}{path}"


def allocate_gpus(observation: HostObservation, n: int, resolved: Resolved, colocated: bool) -> GpuAllocation:
    """Engine `n`'s GPUs from `NARWHAL_GPU_IDS` (or its node override), else every observed GPU.

    Colocated engines must each name their GPUs with the node variable: sharing a GPU between two engines
    would let one engine's memory utilisation starve the other.
    """
    host = observation.host_id
    if not observation.gpus:
        raise InputError([f"host {host}: no GPUs observed for engine-{n} (nvidia-smi listed none)"])
    node_variable = resolved.field.node_variable(n)
    if colocated and resolved.variable != node_variable:
        raise InputError([f"host {host}: engine-{n} shares the host with another engine; set {node_variable} "
                          "to GPU indices or UUIDs disjoint from the other engines' allocations"])
    if resolved.value is None:
        return GpuAllocation(tuple(sorted(observation.gpus, key=lambda g: g.index)))
    return _explicit_allocation(observation, n, resolved)


def _explicit_allocation(observation: HostObservation, n: int, resolved: Resolved) -> GpuAllocation:
    by_key: dict[str, Gpu] = {str(g.index): g for g in observation.gpus}
    by_key.update({g.uuid: g for g in observation.gpus})
    tokens = [t.strip() for t in resolved.value.split(",")] if resolved.value else []
    where = f"engine-{n}: {resolved.name}"
    if not tokens or "" in tokens:
        raise InputError([f"{where} must be a comma-separated list of GPU indices or UUIDs"])
    unknown = [t for t in tokens if t not in by_key]
    if unknown:
        known = ", ".join(str(g.index) for g in sorted(observation.gpus, key=lambda g: g.index))
        raise InputError([f"{where} names GPUs not observed on host {observation.host_id}: "
                          f"{', '.join(unknown)} (observed indices: {known})"])
    gpus = tuple(by_key[t] for t in tokens)
    if len({g.index for g in gpus}) != len(gpus):
        raise InputError([f"{where} names the same GPU twice"])
    return GpuAllocation(gpus)


def accelerator_name(allocation: GpuAllocation, n: int) -> str:
    """The single GPU product of an allocation; mixed products within one engine are refused."""
    names = sorted({g.name for g in allocation.gpus})
    if len(names) != 1:
        raise InputError([f"engine-{n}: allocated GPUs mix products ({'; '.join(names)}); choose one product"])
    return names[0]


def select_transfer(
    observation: HostObservation, n: int, transport: str, interface: str, gpu_tls: GpuTls, variable: str
) -> Transfer:
    """UCX devices: TCP over the fabric interface, or for `ucx_rdma` the ACTIVE RDMA ports (those bound to the
    fabric interface first) with their HCAs' verbs character devices and `rdma_cm`, as discovery observed
    them under /dev/infiniband: without those mapped an RDMA container has no verbs device."""
    if transport == "ucx_tcp":
        return Transfer(transport="ucx_tcp", net_devices=interface, devices=[], gpu_tls=gpu_tls)
    host = observation.host_id
    active = [p for p in observation.rdma if p.active]
    if not active:
        raise InputError([f"host {host}: engine-{n} {variable} is ucx_rdma but no ACTIVE RDMA port was observed; "
                          "use ucx_tcp or bring a port up"])  # fmt: skip
    ports = [p for p in active if interface in p.netdevs] or active
    devices = _rdma_devices(observation, n, variable, ports)
    return Transfer(transport="ucx_rdma", net_devices=",".join(f"{p.device}:{p.port}" for p in ports),
                    devices=devices, gpu_tls=gpu_tls)  # fmt: skip


def _rdma_devices(observation: HostObservation, n: int, variable: str, ports: list[RdmaPort]) -> list[str]:
    """`/dev/infiniband/rdma_cm` when present, then each selected HCA's `uverbs<N>`; a port whose HCA has no
    verbs character device is refused, naming the transport variable."""
    present = set(observation.rdma_devices)
    devices = [f"{RDMA_DEVICE_DIR}/{RDMA_CM}"] if RDMA_CM in present else []
    for port in ports:
        verbs = [name for name in port.verbs if name in present]
        if not verbs:
            raise InputError([f"host {observation.host_id}: engine-{n} {variable} is ucx_rdma but {port.device} "
                              f"has no verbs character device under {RDMA_DEVICE_DIR} (is ib_uverbs loaded?); use "
                              "ucx_tcp or load the driver"])  # fmt: skip
        devices += [f"{RDMA_DEVICE_DIR}/{name}" for name in verbs]
    return list(dict.fromkeys(devices))

"""Where an engine runs on its host: fabric address, GPU allocation and device nodes, UCX selection.

Everything here is derived from one host's observation, so messages name the host and the variable to
change.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from narwhal_assets.core.discovery.observations import Gpu, HostObservation
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.launch.policy import Resolved

Transport = Literal["ucx_tcp", "ucx_rdma"]
TRANSPORTS: tuple[str, ...] = ("ucx_tcp", "ucx_rdma")
GPU_TLS: tuple[str, ...] = ("cuda_copy", "cuda_ipc", "gdr_copy")
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
_NET_TLS = {"ucx_tcp": "tcp", "ucx_rdma": "rc"}


class Transfer(BaseModel):
    """The resolved UCX selection of one engine (`transfer` in a launch record)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Transport
    net_devices: str
    devices: list[str]
    gpu_tls: list[str]

    @property
    def ucx_tls(self) -> str:
        return ",".join([_NET_TLS[self.transport], *self.gpu_tls])


@dataclass(frozen=True)
class GpuAllocation:
    """The GPUs an engine owns: the observed rows plus the ids as the operator wrote them."""

    gpus: tuple[Gpu, ...]
    ids: tuple[int | str, ...]

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(g.index for g in self.gpus)

    def device_paths(self) -> list[str]:
        """Host device nodes the container runtime maps for these GPUs (index = device minor)."""
        return [f"/dev/nvidia{g.index}" for g in self.gpus] + list(CONTROL_DEVICES)

    def visible_devices(self) -> str:
        """`CUDA_VISIBLE_DEVICES` inside the container: `--gpus device=...` renumbers them from 0.

        Indices, not UUIDs: vLLM converts `CUDA_VISIBLE_DEVICES` entries with int().
        """
        return ",".join(str(i) for i in range(len(self.gpus)))


def fabric_address(observation: HostObservation, interface: str, variable: str) -> str:
    """The fabric IP: a global IPv4 address of `interface` if it has one, else a global IPv6 address."""
    found = observation.interface(interface)
    host = observation.host_id
    if found is None:
        known = ", ".join(i.name for i in observation.interfaces) or "none"
        raise InputError([f"host {host}: fabric interface {interface!r} ({variable}) not found "
                          f"(observed interfaces: {known})"])
    for family in ("inet", "inet6"):
        for address in found.addresses:
            if address.family == family and address.scope == "global" and _routable(address.address):
                return address.address
    raise InputError([f"host {host}: fabric interface {interface!r} ({variable}) has no global IPv4 or IPv6 "
                      "address"])


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
        gpus = tuple(sorted(observation.gpus, key=lambda g: g.index))
        return GpuAllocation(gpus, tuple(g.index for g in gpus))
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
    return GpuAllocation(gpus, tuple(int(t) if t.isdigit() else t for t in tokens))


def accelerator_name(allocation: GpuAllocation, n: int) -> str:
    """The single GPU product of an allocation; mixed products within one engine are refused."""
    names = sorted({g.name for g in allocation.gpus})
    if len(names) != 1:
        raise InputError([f"engine-{n}: allocated GPUs mix products ({'; '.join(names)}); choose one product"])
    return names[0]


def select_transfer(
    observation: HostObservation, n: int, transport: str, interface: str, gpu_tls: list[str], variable: str
) -> Transfer:
    """UCX devices: the ACTIVE RDMA ports for `ucx_rdma` (those bound to the fabric interface first),
    else TCP over the fabric interface."""
    if transport == "ucx_tcp":
        return Transfer(transport="ucx_tcp", net_devices=interface, devices=[interface], gpu_tls=gpu_tls)
    active = [p for p in observation.rdma if p.active]
    if not active:
        raise InputError([f"host {observation.host_id}: engine-{n} {variable} is ucx_rdma but no ACTIVE RDMA "
                          "port was observed; use ucx_tcp or bring a port up"])
    preferred = [p for p in active if interface in p.netdevs] or active
    devices = [f"{p.device}:{p.port}" for p in preferred]
    return Transfer(transport="ucx_rdma", net_devices=",".join(devices), devices=devices, gpu_tls=gpu_tls)

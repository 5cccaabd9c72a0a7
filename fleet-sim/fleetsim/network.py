"""Addresses and links of a simulated fleet, all inside 198.18.0.0/15 (RFC 2544 benchmarking space).

Layout per fleet, sized at construction for the most hosts it will hold (`plan_prefixes`): a random unused,
aligned block for management links, cut into point-to-point /30s (near side .1, host side .2 of each block;
the last /30 is the sink's gateway), and a second block for the fabric, a Linux bridge with one port per
host (hosts from .10). Up to DEFAULT_CAPACITY hosts both blocks are /24s; a 250-host fleet takes a /22 and
a /23, a MAX_HOSTS one a /20 and a /22. A "sink" in the root namespace owns both blocks at low priority: a
veth whose peer stays down, reached through a gateway with a permanent neighbour entry, so traffic to an
address of this fleet without a live link is silently dropped (a timeout, as on a cut cable) instead of
leaking out of the default route. (This kernel has no `dummy` driver.) The routes also mark the blocks as
taken for parallel fleets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import random
import re
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

from fleetsim import system
from fleetsim.system import FleetError, run

FLEET_SPACE = IPv4Network("198.18.0.0/15")
DEFAULT_CAPACITY = 60  # hosts a fleet holds unless it asks for more: one /24 each for management and fabric
MAX_HOSTS = 1000  # the fleet limit: the size the deployer is built for (a /20 and a /22)
FABRIC_FIRST = 10  # the first host's fabric address is .10 of the fabric block
HOST_MGMT_IF = "mgmt0"
HOST_FABRIC_IF = "fab0"
SINK_METRIC = 4000


def used_networks() -> list[IPv4Network]:
    """Every IPv4 network the root namespace has an address or a route in."""
    nets = []
    for line in run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.append(IPv4Interface(fields[fields.index("inet") + 1]).network)
    for line in run(["ip", "-4", "route", "show", "table", "all"]).stdout.splitlines():
        dest = line.split()[0] if line.split() else "default"
        if dest[0].isdigit():
            nets.append(IPv4Network(dest, strict=False))
    return nets


def plan_prefixes(capacity: int) -> tuple[int, int]:
    """Prefix lengths of the management and fabric blocks for a fleet of at most `capacity` hosts.

    Management: a /30 per host plus the sink gateway's; fabric: FABRIC_FIRST addresses, one per host and the
    broadcast. Never smaller than a /24, so small fleets keep the plain /24 layout.
    """
    if not 1 <= capacity <= MAX_HOSTS:
        raise FleetError(f"a fleet holds 1 to {MAX_HOSTS} hosts, not {capacity}")
    mgmt = 32 - (4 * (capacity + 1) - 1).bit_length()
    fabric = 32 - (FABRIC_FIRST + capacity).bit_length()
    return min(mgmt, 24), min(fabric, 24)


def pick_networks(prefixes: list[int], rng: random.Random | None = None) -> list[IPv4Network]:
    """One aligned block of 198.18.0.0/15 per prefix length, none overlapping another or anything the root
    namespace uses yet."""
    rng = rng or random.SystemRandom()
    taken = list(ipaddress.collapse_addresses(used_networks()))  # a large fleet's thousand /30s are a few blocks
    picked: list[IPv4Network] = []
    for prefix in prefixes:
        free = [net for net in FLEET_SPACE.subnets(new_prefix=prefix) if not any(net.overlaps(u) for u in taken)]
        if not free:
            raise FleetError(f"no unused /{prefix} network left in {FLEET_SPACE}")
        picked.append(rng.choice(free))
        taken.append(picked[-1])
    return picked


def _mac(prefix: str, kind: str, index: int) -> str:
    """A locally administered unicast MAC, stable per fleet, link kind and host index."""
    raw = hashlib.sha256(f"{prefix}/{kind}/{index}".encode()).digest()[:5]
    return "02:" + ":".join(f"{b:02x}" for b in raw)


@dataclass(frozen=True)
class HostLinks:
    """The interfaces of one simulated host and of the namespace its management link ends in."""

    netns: str
    near_netns: str | None  # None: the root namespace; else the bastion host's namespace
    mgmt_link: str  # near-side veth name
    fabric_link: str  # root-side veth name, a bridge port
    near_ip: IPv4Interface
    host_ip: IPv4Interface
    fabric_ip: IPv4Interface
    near_mac: str
    host_mac: str


@dataclass(frozen=True)
class FleetNetwork:
    """Names and address plan of one fleet; creating and deleting the links is explicit."""

    prefix: str
    mgmt: IPv4Network
    fabric: IPv4Network
    capacity: int = DEFAULT_CAPACITY

    def __post_init__(self) -> None:
        mgmt, fabric = plan_prefixes(self.capacity)
        if self.mgmt.prefixlen > mgmt or self.fabric.prefixlen > fabric:
            raise FleetError(f"/{self.mgmt.prefixlen} and /{self.fabric.prefixlen} cannot hold {self.capacity} hosts")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def sink(self) -> str:
        return f"{self.prefix}sink"

    def host_links(self, index: int, netns: str, near_netns: str | None) -> HostLinks:
        if not 0 <= index < self.capacity:
            raise FleetError(
                f"fleet {self.prefix} holds at most {self.capacity} hosts (SimFleet(capacity=N), up to {MAX_HOSTS})"
            )
        block = IPv4Network((int(self.mgmt.network_address) + 4 * index, 30))
        return HostLinks(
            netns=netns,
            near_netns=near_netns,
            mgmt_link=f"{self.prefix}m{index}",
            fabric_link=f"{self.prefix}f{index}",
            near_ip=IPv4Interface(f"{block[1]}/30"),
            host_ip=IPv4Interface(f"{block[2]}/30"),
            fabric_ip=IPv4Interface(f"{self.fabric[FABRIC_FIRST + index]}/{self.fabric.prefixlen}"),
            near_mac=_mac(self.prefix, "near", index),
            host_mac=_mac(self.prefix, "host", index),
        )

    def create_fleet_links(self) -> list[str]:
        """The sink (claims both blocks) and the fabric bridge; returns the root-namespace link names."""
        gateway = self.mgmt[-2]  # in the last /30 block, which no host uses (plan_prefixes leaves it free)
        _batch(None, [
            f"link add {self.sink} address {_mac(self.prefix, 'sink', 0)} type veth peer name {self.sink}x",
            f"link add {self.bridge} type bridge",
        ])  # fmt: skip
        disable_ipv6(self.sink, f"{self.sink}x", self.bridge)
        batch = [
            f"link set {self.sink} up",
            f"neigh replace {gateway} lladdr {_mac(self.prefix, 'void', 0)} dev {self.sink} nud permanent",
            f"route add {self.mgmt} via {gateway} dev {self.sink} onlink metric {SINK_METRIC}",
            f"route add {self.fabric} via {gateway} dev {self.sink} onlink metric {SINK_METRIC}",
            f"link set {self.bridge} up",
        ]
        _batch(None, batch)
        return [self.sink, self.bridge]

    def check_unshared(self) -> None:
        """Detect the (unlikely) race where a parallel fleet claimed an overlapping block at the same moment."""
        for line in run(["ip", "-4", "route", "show"]).stdout.splitlines():
            fields = line.split()
            if not fields or not fields[0][0].isdigit():
                continue
            net = ipaddress.ip_network(fields[0], strict=False)
            dev = fields[fields.index("dev") + 1] if "dev" in fields else ""
            ours = dev == self.sink or re.fullmatch(rf"{self.prefix}m[0-9]+", dev) is not None
            if not ours and (net.overlaps(self.mgmt) or net.overlaps(self.fabric)):
                raise FleetError(f"{net} is also used by {dev or 'another route'}; retry the fleet")


def create_host_links(hosts: list[HostLinks], bridge: str) -> None:
    """Namespaces, management veths (to root or bastion), fabric veths on the bridge, addresses, up.

    Batched over `hosts` (one `ip -batch` per step in the root namespace, one per bastion and one per host
    namespace), so bringing a large fleet up costs a few processes per host, not a dozen. The near side
    gets a permanent neighbour entry for the host, so a cut link drops packets silently (a timeout) rather
    than failing ARP with "No route to host". IPv6 is disabled on every fleet link before it comes up, so
    no link-local chatter (DAD, router solicitations) is ever sent.
    """
    _batch(None, [f"netns add {links.netns}" for links in hosts])
    for links in hosts:
        system.netns_sysctl(links.netns, "net/ipv6/conf/default/disable_ipv6", "1")
    direct = [links for links in hosts if links.near_netns is None]
    _batch(None, [*(_mgmt_veth(links) for links in direct), *(_fabric_veth(links) for links in hosts)])
    disable_ipv6(*(links.mgmt_link for links in direct), *(links.fabric_link for links in hosts))
    _batch(None, [*(cmd for links in direct for cmd in _near_up(links)),
                  *(cmd for links in hosts for cmd in _fabric_up(links, bridge))])  # fmt: skip
    behind: dict[str, list[str]] = {}
    for links in hosts:
        if links.near_netns is not None:  # the bastion's namespace already defaults to IPv6 off
            behind.setdefault(links.near_netns, []).extend([_mgmt_veth(links), *_near_up(links)])
    for near_netns, commands in behind.items():
        _batch(near_netns, commands)
    for links in hosts:
        _batch(links.netns, [
            "link set lo up",
            f"addr add {links.host_ip} dev {HOST_MGMT_IF}",
            f"link set {HOST_MGMT_IF} up",
            f"addr add {links.fabric_ip} dev {HOST_FABRIC_IF}",
            f"link set {HOST_FABRIC_IF} up",
        ])  # fmt: skip


def _mgmt_veth(links: HostLinks) -> str:
    return (f"link add {links.mgmt_link} address {links.near_mac} type veth"
            f" peer name {HOST_MGMT_IF} address {links.host_mac} netns {links.netns}")  # fmt: skip


def _fabric_veth(links: HostLinks) -> str:
    return f"link add {links.fabric_link} type veth peer name {HOST_FABRIC_IF} netns {links.netns}"


def _near_up(links: HostLinks) -> list[str]:
    return [
        f"addr add {links.near_ip} dev {links.mgmt_link}",
        f"link set {links.mgmt_link} up",
        f"neigh replace {links.host_ip.ip} lladdr {links.host_mac} dev {links.mgmt_link} nud permanent",
    ]


def _fabric_up(links: HostLinks, bridge: str) -> list[str]:
    return [f"link set {links.fabric_link} master {bridge}", f"link set {links.fabric_link} up"]


def disable_ipv6(*links: str) -> None:
    """Turn IPv6 off on root-namespace links of the fleet (before they are brought up)."""
    for link in links:
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1\n", encoding="ascii")


def set_host_link(netns: str, up: bool) -> None:
    """Bring the host's end of its management link up or down (down: peers see a dead cable)."""
    run(["ip", "-n", netns, "link", "set", HOST_MGMT_IF, "up" if up else "down"])


def delete_links(names: list[str]) -> None:
    """Delete root-namespace links (a veth takes its peer along); those already gone are passed over."""
    _batch(None, [f"link del {name}" for name in names], check=False)


def delete_netns(names: list[str]) -> None:
    _batch(None, [f"netns del {name}" for name in names], check=False)


def _batch(netns: str | None, commands: list[str], *, check: bool = True) -> None:
    """Run `ip` commands in one process (`ip -batch`), in `netns` or the root namespace; unchecked, a failed
    command does not stop the others (`-force`)."""
    if not commands:
        return
    argv = ["ip", "-batch", "-"] if netns is None else ["ip", "-n", netns, "-batch", "-"]
    run(argv if check else [argv[0], "-force", *argv[1:]], stdin="\n".join(commands) + "\n", check=check)

"""Addresses and links of a simulated fleet, all inside 198.18.0.0/15 (RFC 2544 benchmarking space).

Layout per fleet: a random unused /24 for management links, cut into point-to-point /30s (near side .1,
host side .2 of each block), and a second /24 for the fabric, a Linux bridge with one port per host.
A "sink" in the root namespace owns both /24s at low priority: a veth whose peer stays down, reached
through a gateway with a permanent neighbour entry, so traffic to an address of this fleet without a
live link is silently dropped (a timeout, as on a cut cable) instead of leaking out of the default
route. (This kernel has no `dummy` driver.) The routes also mark the /24s as taken for parallel fleets.
"""

from __future__ import annotations

import hashlib
import ipaddress
import random
import re
from dataclasses import dataclass
from ipaddress import IPv4Interface, IPv4Network
from pathlib import Path

from fleetsim.system import FleetError, run

FLEET_SPACE = IPv4Network("198.18.0.0/15")
MAX_HOSTS = 60
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


def pick_subnets(count: int, rng: random.Random | None = None) -> list[IPv4Network]:
    """`count` distinct /24s of 198.18.0.0/15 that nothing in the root namespace uses yet."""
    rng = rng or random.SystemRandom()
    used = used_networks()
    free = [net for net in FLEET_SPACE.subnets(new_prefix=24) if not any(net.overlaps(u) for u in used)]
    if len(free) < count:
        raise FleetError(f"fewer than {count} unused /24 networks left in {FLEET_SPACE}")
    return rng.sample(free, count)


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

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def sink(self) -> str:
        return f"{self.prefix}sink"

    def host_links(self, index: int, netns: str, near_netns: str | None) -> HostLinks:
        if not 0 <= index < MAX_HOSTS:
            raise FleetError(f"a fleet holds at most {MAX_HOSTS} hosts")
        block = list(self.mgmt.subnets(new_prefix=30))[index]
        return HostLinks(
            netns=netns,
            near_netns=near_netns,
            mgmt_link=f"{self.prefix}m{index}",
            fabric_link=f"{self.prefix}f{index}",
            near_ip=IPv4Interface(f"{block[1]}/30"),
            host_ip=IPv4Interface(f"{block[2]}/30"),
            fabric_ip=IPv4Interface(f"{self.fabric[10 + index]}/{self.fabric.prefixlen}"),
            near_mac=_mac(self.prefix, "near", index),
            host_mac=_mac(self.prefix, "host", index),
        )

    def create_fleet_links(self) -> list[str]:
        """The sink (claims both /24s) and the fabric bridge; returns the root-namespace link names."""
        gateway = self.mgmt[-2]  # in the last /30 block, which no host uses (MAX_HOSTS < 64)
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
        """Detect the (unlikely) race where a parallel fleet claimed the same /24 at the same moment."""
        for line in run(["ip", "-4", "route", "show"]).stdout.splitlines():
            fields = line.split()
            if not fields or not fields[0][0].isdigit():
                continue
            net = ipaddress.ip_network(fields[0], strict=False)
            dev = fields[fields.index("dev") + 1] if "dev" in fields else ""
            ours = dev == self.sink or re.fullmatch(rf"{self.prefix}m[0-9]+", dev) is not None
            if not ours and (net.overlaps(self.mgmt) or net.overlaps(self.fabric)):
                raise FleetError(f"{net} is also used by {dev or 'another route'}; retry the fleet")


def create_host_links(links: HostLinks, bridge: str) -> None:
    """Namespace, management veth (to root or bastion), fabric veth on the bridge, addresses, up.

    The near side gets a permanent neighbour entry for the host, so a cut link drops packets silently
    (a timeout) rather than failing ARP with "No route to host". IPv6 is disabled on every fleet link
    before it comes up, so no link-local chatter (DAD, router solicitations) is ever sent.
    """
    run(["ip", "netns", "add", links.netns])
    run(["ip", "netns", "exec", links.netns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
    mgmt = (
        f"link add {links.mgmt_link} address {links.near_mac} type veth"
        f" peer name {HOST_MGMT_IF} address {links.host_mac} netns {links.netns}"
    )
    fabric = f"link add {links.fabric_link} type veth peer name {HOST_FABRIC_IF} netns {links.netns}"
    near_up = [
        f"addr add {links.near_ip} dev {links.mgmt_link}",
        f"link set {links.mgmt_link} up",
        f"neigh replace {links.host_ip.ip} lladdr {links.host_mac} dev {links.mgmt_link} nud permanent",
    ]
    fabric_up = [f"link set {links.fabric_link} master {bridge}", f"link set {links.fabric_link} up"]
    if links.near_netns is None:
        _batch(None, [mgmt, fabric])
        disable_ipv6(links.mgmt_link, links.fabric_link)
        _batch(None, near_up + fabric_up)
    else:  # the bastion's namespace already defaults to IPv6 off
        _batch(links.near_netns, [mgmt, *near_up])
        _batch(None, [fabric])
        disable_ipv6(links.fabric_link)
        _batch(None, fabric_up)
    _batch(
        links.netns,
        [
            "link set lo up",
            f"addr add {links.host_ip} dev {HOST_MGMT_IF}",
            f"link set {HOST_MGMT_IF} up",
            f"addr add {links.fabric_ip} dev {HOST_FABRIC_IF}",
            f"link set {HOST_FABRIC_IF} up",
        ],
    )


def disable_ipv6(*links: str) -> None:
    """Turn IPv6 off on root-namespace links of the fleet (before they are brought up)."""
    for link in links:
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1\n", encoding="ascii")


def set_host_link(netns: str, up: bool) -> None:
    """Bring the host's end of its management link up or down (down: peers see a dead cable)."""
    run(["ip", "-n", netns, "link", "set", HOST_MGMT_IF, "up" if up else "down"])


def delete_link(name: str) -> None:
    run(["ip", "link", "del", name], check=False)


def delete_netns(name: str) -> None:
    run(["ip", "netns", "del", name], check=False)


def _batch(netns: str | None, commands: list[str]) -> None:
    """Run `ip` commands in one process (`ip -batch`), in `netns` or the root namespace."""
    argv = ["ip", "-batch", "-"] if netns is None else ["ip", "-n", netns, "-batch", "-"]
    run(argv, stdin="\n".join(commands) + "\n")

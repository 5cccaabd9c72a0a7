"""Engine ports: parsing, and the rule that no two port claims overlap on one host.

Engines on one host share the host network namespace (`--network host`), so an overlap between any two
claims (also across colocated engines) is a bind failure or, worse, cross-talk between engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.launch.policy import Resolved

MAX_PORT = 65535
MAX_UCX_RANGE_PORTS = 2049
_RANGE_RE = re.compile(r"([0-9]{1,5})-([0-9]{1,5})")


@dataclass(frozen=True, order=True)
class PortClaim:
    """Ports `low..high` (inclusive) that `engine` needs, set by `variable`."""

    low: int
    high: int
    engine: str
    variable: str

    def describe(self) -> str:
        ports = str(self.low) if self.low == self.high else f"{self.low}-{self.high}"
        return f"{self.engine} {self.variable} ({ports})"


def parse_port(resolved: Resolved, n: int) -> int:
    """A TCP port 1..65535; the error names the variable."""
    text = (resolved.value or "").strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_PORT:
        raise InputError([f"engine-{n}: {resolved.name} must be a port number in 1..{MAX_PORT}"])
    return int(text)


def parse_port_range(resolved: Resolved, n: int) -> tuple[int, int]:
    """`A-B` with 1 <= A <= B <= 65535 and at most 2049 ports (what the serving side accepts)."""
    match = _RANGE_RE.fullmatch((resolved.value or "").strip())
    low, high = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not match or not 1 <= low <= high <= MAX_PORT:
        raise InputError([f"engine-{n}: {resolved.name} must be 'A-B' with 1 <= A <= B <= {MAX_PORT}"])
    if high - low + 1 > MAX_UCX_RANGE_PORTS:
        raise InputError([f"engine-{n}: {resolved.name} spans {high - low + 1} ports; at most "
                          f"{MAX_UCX_RANGE_PORTS} are allowed"])
    return low, high


def nixl_window(side_channel_port: int, tensor_parallel: int) -> tuple[int, int]:
    """The side-channel port plus one port per TP rank above it (vLLM listens on base + rank)."""
    return side_channel_port, side_channel_port + tensor_parallel


def window_problem(claim: PortClaim) -> str | None:
    """A reserved window (side channel + one port per TP rank) must stay below 65536."""
    if claim.high > MAX_PORT:
        return f"{claim.engine}: {claim.variable} plus its per-rank window ends above port {MAX_PORT}"
    return None


def overlap_problems(host_id: str, claims: list[PortClaim]) -> list[str]:
    """One line per overlapping pair of claims on host `host_id`."""
    ordered = sorted(claims)
    problems = []
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            if second.low > first.high:
                break
            problems.append(
                f"host {host_id}: {first.describe()} overlaps {second.describe()}; engine, attestation, "
                "NIXL side-channel ports and the UCX TCP range must not overlap on a host"
            )
    return problems

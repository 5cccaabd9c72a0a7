"""What the inventory sensor watches, as pure functions: input states, when they need a discovery, the host diff.

Each watched input is recorded as its SHA-256, `absent`, or `published` when its bytes are exactly what the
latest complete discovery published (its manifest). Discovery itself rewrites `config/deployment.env`, the
inventory and the trust store; recording those as `published` keeps a discovery from triggering the next.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from narwhal_assets.core.errors import InputError

ABSENT = "absent"
PUBLISHED = "published"
NO_DISCOVERY = "no discovery has completed yet"
_DURATION_RE = re.compile(r"([1-9][0-9]*)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class HostDiff:
    """Partition keys to add (inventory order) and to delete (sorted) so the partitions equal the inventory."""

    added: list[str]
    removed: list[str]


def host_diff(current: Iterable[str], wanted: Sequence[str]) -> HostDiff:
    present = set(current)
    return HostDiff(added=[h for h in wanted if h not in present], removed=sorted(present - set(wanted)))


def input_states(hashes: Mapping[str, str | None], published: Mapping[str, str]) -> dict[str, str]:
    """Per input label: `absent`, `published` (same SHA-256 as the latest discovery's manifest), or its SHA-256."""
    return {
        label: ABSENT if digest is None else PUBLISHED if published.get(label) == digest else digest
        for label, digest in hashes.items()
    }


def rediscovery_reasons(previous: Mapping[str, str] | None, current: Mapping[str, str], discovered: bool) -> list[str]:
    """Why a discovery is needed now (empty: it is not).

    The first evaluation only records a baseline, unless no discovery ever completed. Later, every input
    whose state changed counts, except one that became what discovery itself published.
    """
    if previous is None:
        return [] if discovered else [NO_DISCOVERY]
    # An input no longer watched (say NARWHAL_SSH_CONFIG now names no file) reads as absent.
    now = {label: current.get(label, ABSENT) for label in set(previous) | set(current)}
    changed = sorted(label for label, state in now.items() if state != previous.get(label) and state != PUBLISHED)
    return [f"{label} changed" for label in changed]


def run_key(states: Mapping[str, str]) -> str:
    """Stable across ticks for the same inputs, so Dagster launches one discovery per input state."""
    return "inputs-" + hashlib.sha256(json.dumps(dict(states), sort_keys=True).encode()).hexdigest()[:32]


def parse_duration(name: str, text: str) -> int:
    """Seconds from `90`, `90s`, `15m`, `1h` or `7d`; an error names the variable, never echoes the value."""
    match = _DURATION_RE.fullmatch(text.strip())
    if not match:
        raise InputError([f"{name}: expected a positive duration such as 3600, 90s, 15m, 1h or 7d"])
    return int(match.group(1)) * _UNIT_S[match.group(2)]

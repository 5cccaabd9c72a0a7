"""Work over many hosts at once: the one thread pool every host-wide operation uses.

Each host's work is mostly waiting on its SSH connection, so threads (not processes) carry it; results come
back in the order of the hosts given (inventory order), whatever order they finished in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
# Hosts a fleet command works on at once (install's `--max-parallel` default, status, prune, leases). A host's
# own work (an install's clone, venv and package install: tens of seconds) dominates; the workstation spends
# about 20 ms of CPU, one connection and two threads per host at a time, so 32 at once stays under one core and
# about 100 MB while a 1,000-host fleet takes about 1,000 / 32 host-install times (docs/scale.md).
HOSTS_AT_ONCE = 32


def over_hosts(items: Sequence[T], work: Callable[[T], R], workers: int) -> list[R]:
    """`work(item)` for every item, at most `workers` at once, results in the order of `items`."""
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="narwhal-host") as pool:
        return list(pool.map(work, items))

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


def over_hosts(items: Sequence[T], work: Callable[[T], R], workers: int) -> list[R]:
    """`work(item)` for every item, at most `workers` at once, results in the order of `items`."""
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="narwhal-host") as pool:
        return list(pool.map(work, items))

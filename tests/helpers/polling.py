"""Bounded waits for an event (never timing assertions)."""

from __future__ import annotations

import time


def wait_for(predicate: object, what: str, limit: float = 120.0) -> None:
    """Poll until `predicate()` holds (a bounded wait for an event, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)

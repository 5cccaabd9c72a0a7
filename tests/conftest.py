"""Hooks for every test directory: `fleet` tests skip where a simulated fleet cannot run, except in CI."""

from __future__ import annotations

import os

import pytest

from narwhal_assets.fleetsim import missing_prerequisites


def require_fleet_prerequisites() -> None:
    """Skip when root, sshd or the network tools are missing; under CI (`CI` set) fail instead, so the
    security tests that need real sshd hosts can never be skipped silently there."""
    missing = missing_prerequisites()
    if not missing:
        return
    reason = "simulated fleet unavailable here, missing: " + "; ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: fleet tests must run, not skip)", pytrace=False)
    pytest.skip(reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("fleet") is not None:
        require_fleet_prerequisites()

"""Hooks for every test directory: `fleet` tests skip where a simulated fleet cannot run, except in CI."""

from __future__ import annotations

import os

import pytest

from fleetsim import missing_prerequisites


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


@pytest.fixture(autouse=True)
def operator_umask() -> None:
    """Each test starts under a usual operator umask (022), whatever an in-process command or an import of the
    code location (both set 077 for the whole process) left behind: a mode test must not pass by umask alone."""
    os.umask(0o022)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("fleet") is not None:
        require_fleet_prerequisites()

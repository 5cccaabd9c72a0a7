"""Fixtures for tests against simulated hosts (real sshd in network namespaces, see fleetsim)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleetsim.client import FleetSsh

from fleetsim import SimFleet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that builds a fleet is a `fleet` test, so the root conftest skips (or in CI fails) it."""
    for item in items:
        if "sim_fleet_factory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fleet)


@pytest.fixture(autouse=True)
def checkout_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test's checkout alone decides settings: no NARWHAL_* from the caller, a private DAGSTER_HOME."""
    for name in list(os.environ):
        if name.startswith("NARWHAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))


@pytest.fixture(scope="session")
def sim_fleet_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SimFleet]]:
    """`sim_fleet_factory(prefix=None) -> SimFleet` under pytest's tmp dirs; all closed at session end."""
    fleets: list[SimFleet] = []

    def make(*, prefix: str | None = None) -> SimFleet:
        workdir = tmp_path_factory.mktemp("fleet")
        fleet = SimFleet(workdir, prefix=prefix)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


@pytest.fixture
def make_ssh(tmp_path: Path) -> Callable[[SimFleet], FleetSsh]:
    """`make_ssh(fleet) -> FleetSsh` with its own empty known_hosts under this test's tmp_path."""
    return lambda fleet: FleetSsh.create(fleet.ssh_config_path, tmp_path, fleet.prefix)

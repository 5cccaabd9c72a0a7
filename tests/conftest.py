"""Hooks and fixtures for every test directory: `fleet` tests skip where a simulated fleet cannot run, except in
CI; the simulated fleets, the shared model fleet (helpers.fleet_checkout) and checkouts wired to it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleetsim import SimFleet, missing_prerequisites
from helpers.fleet_checkout import DESTINATIONS, LINKS, MODEL, MODEL_CONFIG, PASSWORD, WEIGHTS, make_checkout
from helpers.signals import restore_starting_dispositions


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


@pytest.fixture(autouse=True)
def starting_signal_dispositions() -> None:
    """Each test starts with SIGINT and SIGTERM as pytest started (helpers/signals.py says why)."""
    restore_starting_dispositions()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that builds a fleet is a `fleet` test, so `pytest_runtest_setup` skips (or in CI fails) it."""
    for item in items:
        if "sim_fleet_factory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fleet)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("fleet") is not None:
        require_fleet_prerequisites()


# --------------------------------------------------------------------------------------------- fleet fixtures


@pytest.fixture
def checkout_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test's checkout alone decides settings: no NARWHAL_* from the caller, a private DAGSTER_HOME.
    Autouse in the fleet, e2e and postgres directories (their conftest.py)."""
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


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    """The model fleet (helpers.fleet_checkout), one per test module."""
    fleet = sim_fleet_factory()
    fleet.add_host("h1")
    fleet.add_host("h2", password=PASSWORD)
    fleet.add_host("h3")
    fleet.start()
    for name, path in fleet.write_model(MODEL, WEIGHTS, MODEL_CONFIG).items():
        for link, target in LINKS.items():
            (path / link).symlink_to(target)
        assert fleet.model_path(name, MODEL) == path
    return fleet


@pytest.fixture(scope="module")
def ssh_config(fleet: SimFleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ssh config whose aliases are the sentinel destinations (outside every checkout)."""
    blocks = []
    for name, alias in DESTINATIONS.items():
        host = fleet.host(name)
        blocks.append(f"Host {alias}\n    HostName {host.address}\n    User {host.user}\n    Port {host.port}\n"
                      f"    IdentityFile {fleet.client_key_path}\n    IdentitiesOnly yes\n")  # fmt: skip
    path = tmp_path_factory.mktemp("sshcfg") / "ssh_config"
    path.write_text("\n".join(blocks), encoding="utf-8")
    path.chmod(0o600)
    return path


@pytest.fixture
def checkout(tmp_path: Path, fleet: SimFleet, ssh_config: Path) -> Path:
    return make_checkout(tmp_path / "checkout", fleet, ssh_config)

"""Fixtures for the team-instance tests: a PostgreSQL server the tests own, and the fleet fixtures (with the
discovery test's model fleet and sentinel ssh config) reused from tests/fleet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fleet.conftest import checkout_env, sim_fleet_factory  # noqa: F401
from fleet.test_discovery import fleet, ssh_config  # noqa: F401
from pgserver import PgServer, running_server


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    with running_server() as server:
        yield server

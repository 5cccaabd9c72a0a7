"""Fixtures for the team-instance tests: a PostgreSQL server the tests own; the model fleet and its ssh config
come from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.pgserver import PgServer, running_server


@pytest.fixture(autouse=True)
def _checkout_env(checkout_env: None) -> None:
    """Every test here runs under `checkout_env`."""


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    with running_server() as server:
        yield server

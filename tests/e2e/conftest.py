"""The browser test runs against the model fleet and its checkout (tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _checkout_env(checkout_env: None) -> None:
    """Every test here runs under `checkout_env`."""

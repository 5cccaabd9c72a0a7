"""Fixtures shared by the unit tests of the host installer (tests/unit/test_installer*.py): a host home on this
machine and the source it installs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.installer_host import Host, make_source


@pytest.fixture
def source(tmp_path: Path) -> tuple[str, bytes]:
    """A one-commit repository's revision and its bundle."""
    return make_source(tmp_path)


@pytest.fixture
def host(tmp_path: Path, source: tuple[str, bytes]) -> Host:
    """An empty home the installer runs in, as a host's account."""
    home = tmp_path / "home"
    home.mkdir()
    return Host(home, *source)

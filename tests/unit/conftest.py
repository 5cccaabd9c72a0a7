"""Fixtures shared by the unit tests of the host installer (tests/unit/test_installer*.py): a host home on this
machine and the source it installs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.installer_host import Host, installed_home, make_source


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


@pytest.fixture(scope="session")
def installed_homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where `installed_home` keeps the homes it installed once for this run: every xdist worker's base
    directory lies in the run's own."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "installed-homes"


@pytest.fixture
def unmarked(installed_homes: Path, tmp_path: Path) -> Host:
    """A home whose deployment stopped just before its marker (a failed check, a killed installer): files,
    checkout and `.venv` complete, not `installed`, no `current`. For tests of what comes after the virtualenv
    is made (locks, checks, commit and activation), copied instead of built (`installed_home`)."""
    return Host(*installed_home(installed_homes, tmp_path / "home", marked=False))

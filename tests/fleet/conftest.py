"""Fixtures for tests against simulated hosts (real sshd in network namespaces, see fleetsim); the fleets
themselves and the model fleet's checkout come from tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fleetsim import SimFleet
from fleetsim.client import FleetSsh
from helpers.deploy_hosts import cli
from helpers.fleet_checkout import make_checkout, set_env
from helpers.git_repo import git_checkout
from helpers.install import OFFLINE_CHECK, SLOW_INSTALL

from narwhal_assets.cli.main import main


@pytest.fixture(autouse=True)
def _checkout_env(checkout_env: None) -> None:
    """Every test here runs under `checkout_env`."""


@pytest.fixture
def make_ssh(tmp_path: Path) -> Callable[[SimFleet], FleetSsh]:
    """`make_ssh(fleet) -> FleetSsh` with its own empty known_hosts under this test's tmp_path."""
    return lambda fleet: FleetSsh.create(fleet.ssh_config_path, tmp_path, fleet.prefix)


@pytest.fixture(scope="module")
def discovered(fleet: SimFleet, ssh_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A discovered git checkout whose .env names the offline install and check commands and the revision."""
    root = make_checkout(tmp_path_factory.mktemp("install") / "checkout", fleet, ssh_config)
    revision = git_checkout(root)
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("NARWHAL_")]:
            patch.delenv(name)
        patch.setenv("DAGSTER_HOME", str(root.parent / "dagster-discovery"))
        assert main(["--root", str(root), "discover"]) == 0
    set_env(root, NARWHAL_DEPLOYMENT_REVISION=revision)
    with (root / ".env").open("a", encoding="utf-8") as env:
        env.write(f"NARWHAL_REMOTE_INSTALL={_quote(SLOW_INSTALL)}\nNARWHAL_REMOTE_CHECK={_quote(OFFLINE_CHECK)}\n")
    return root


@pytest.fixture
def prepared(discovered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A fresh prepared run (`deploy-hosts prepare --out`) of the discovered checkout."""
    out = tmp_path / "prepared"
    rc, _out, err = cli(discovered, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, err
    return out


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"

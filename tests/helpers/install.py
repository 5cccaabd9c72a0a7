"""`deploy-hosts install` as the install tests run it: offline install and check commands (the simulated hosts
have no network), a slow install a test can interrupt, and what an install left on each host and in Dagster."""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet

from helpers.deploy_hosts import cli
from helpers.fleet_checkout import HOST_IDS
from narwhal_assets.core.prepared_run.manifest import DeploymentManifest

NAMES = {host_id: name for name, host_id in HOST_IDS.items()}  # node-1 -> h1
OFFLINE_INSTALL = ("python -c 'import pathlib, site; pathlib.Path(site.getsitepackages()[0], \"checkout.pth\")"
                   ".write_text(str(pathlib.Path.cwd()) + chr(10))'")  # fmt: skip
OFFLINE_CHECK = "python -I -c 'import app.main'"  # the checkout's app/main.py (prints 'served')
SLOW_FLAG = "slow-install"
STARTED_FLAG = "install-started"
# On a host whose home holds SLOW_FLAG, the install command announces itself and then takes long enough
# for the test to kill that host mid-install (60 s, or the seconds the flag file holds).
SLOW_INSTALL = (f'if [ -e "$HOME/{SLOW_FLAG}" ]; then touch "$HOME/{STARTED_FLAG}"; s=$(cat "$HOME/{SLOW_FLAG}"); '
                f'sleep "${{s:-60}}"; fi; {OFFLINE_INSTALL}')


def manifest_of(run: Path) -> DeploymentManifest:
    return DeploymentManifest.model_validate_json((run / "manifest.json").read_bytes())


def remote_dir(fleet: SimFleet, host_id: str, run: Path) -> Path:
    """The host's `~/Narwhal-deploy/<id>/`, seen from the workstation."""
    return fleet.host(NAMES[host_id]).home / manifest_of(run).remote_dir


def install(root: Path, run: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return cli(root, "install", "--run", str(run), *args, capsys=capsys)


def outcomes(out: str) -> dict[str, str]:
    """host id -> the outcome word the command printed for it."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^  (\S+)\s+roles=\S+\s+(installed|reused|failed)", out, re.M)}


def as_host_user(fleet: SimFleet, name: str, path: Path) -> None:
    account = pwd.getpwnam(fleet.host(name).user)
    os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)


def partition_metadata(host_id: str) -> dict[str, object]:
    with dg.DagsterInstance.get() as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("host_installation"), asset_partitions=[host_id]), limit=1
        ).records
        assert records
        materialization = records[0].asset_materialization
        assert materialization is not None
        return {key: value.value for key, value in materialization.metadata.items()}

"""A team instance on PostgreSQL: two workstations (two processes, own checkouts and DAGSTER_HOMEs, one database)
run the pipeline against the simulated fleet with exactly the README's `dagster.yaml`, and see one history.

The database is scanned (pg_dump) for the SSH password, the destinations and the database password.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.files import assert_nowhere
from helpers.fleet_checkout import DESTINATIONS, PASSWORD, make_checkout
from helpers.install import OFFLINE_CHECK, OFFLINE_INSTALL
from helpers.pgserver import PgServer

pytestmark = pytest.mark.fleet
README = Path(__file__).resolve().parents[2] / "README.md"
# What each workstation runs, in order, as `deploy-hosts <step>`: the whole sequence, the install as one partition.
WORKSTATION_STEPS: tuple[tuple[str, ...], ...] = (
    ("discover",),
    ("prepare", "--out", "{root}/runs/deployment-env/team"),
    ("install", "--run", "{root}/runs/deployment-env/team", "--host", "node-1"),
)
# A management checkout is a git repository (prepare ships one of its commits); the simulated hosts have no
# package index, so the install and check commands work offline (helpers.install, as in the install tests).
TRACKED = {".gitignore": "/.env\n/config/\n/runs/\n", "app/main.py": "print('served')\n"}


def readme_instance_yaml() -> str:
    """The README's PostgreSQL `dagster.yaml` block, verbatim (the test uses nothing else)."""
    section = README.read_text(encoding="utf-8").split("## Dagster instance", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1 and "postgres_db" in blocks[0], "README's Dagster instance section has one yaml block"
    return blocks[0]


def workstation(tmp_path: Path, name: str, fleet: SimFleet, ssh_config: Path) -> tuple[Path, Path]:
    """A checkout of its own and a DAGSTER_HOME holding the README's dagster.yaml."""
    root = make_checkout(tmp_path / name / "checkout", fleet, ssh_config)
    for path, text in TRACKED.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", *TRACKED], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "checkout"], check=True)
    revision = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
    with (root / ".env").open("a", encoding="utf-8") as env:
        env.write(f"NARWHAL_DEPLOYMENT_REVISION={revision.strip()}\nNARWHAL_REMOTE_INSTALL={shlex.quote(OFFLINE_INSTALL)}\n"
                  f"NARWHAL_REMOTE_CHECK={shlex.quote(OFFLINE_CHECK)}\n")  # fmt: skip
    home = tmp_path / name / "dagster-home"
    home.mkdir(mode=0o700)
    (home / "dagster.yaml").write_text(readme_instance_yaml(), encoding="utf-8")
    return root, home


def run_steps(root: Path, home: Path, pg: PgServer, cwd: Path) -> list[str]:
    """Each step in a separate process, as an operator runs it; returns every step's stdout + stderr."""
    env = {**os.environ, **pg.env, "DAGSTER_HOME": str(home)}
    outputs = []
    for step in WORKSTATION_STEPS:
        argv = [arg.format(root=root) for arg in step]
        done = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), *argv], env=env,
                              cwd=cwd, capture_output=True, text=True, timeout=600)  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(step)} on {root}: {output}"
        assert "Traceback" not in output
        outputs.append(output)
    return outputs


def test_two_workstations_share_one_history_on_postgres(
    pg_server: PgServer, fleet: SimFleet, ssh_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stations = {name: workstation(tmp_path, name, fleet, ssh_config) for name in ("ws-a", "ws-b")}
    logs = {name: run_steps(root, home, pg_server, tmp_path) for name, (root, home) in stations.items()}

    for key, value in pg_server.env.items():
        monkeypatch.setenv(key, value)
    for name, (_root, home) in stations.items():
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        with dg.DagsterInstance.get() as instance:
            assert "postgres" in type(instance.run_storage).__module__, f"{name} is on PostgreSQL"
            runs = instance.get_runs()
            assert len(runs) == len(stations) * len(WORKSTATION_STEPS), f"{name} sees every workstation's runs"
            assert {run.status for run in runs} == {dg.DagsterRunStatus.SUCCESS}
            records = instance.fetch_materializations(dg.AssetKey("host_observations"), limit=100).records
            run_dirs = {str(r.asset_materialization.metadata["run_dir"].value) for r in records}  # type: ignore[union-attr]
            for other, (root, _home) in stations.items():
                assert any(d.startswith(str(root)) for d in run_dirs), f"{name} sees {other}'s discovery"

    dump = pg_server.dump()
    assert "host_observations" in dump and "narwhal_assets" in dump, "the dump holds the event log"
    secrets = [PASSWORD, *DESTINATIONS.values(), pg_server.password, pg_server.admin_password]
    for needle in secrets:
        assert needle not in dump, "a secret (password or destination) is stored in the PostgreSQL database"
    for name, (root, home) in stations.items():
        assert_nowhere(secrets, [root, home])
        for output in logs[name]:
            assert not any(needle in output for needle in secrets), f"{name}'s output shows a secret"

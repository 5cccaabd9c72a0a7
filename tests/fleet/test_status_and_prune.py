"""Which deployment each host runs (`deploy-hosts status`), rollback to a previous prepared run, and prune,
against real sshd hosts: the install tests' checkout and fleet (the `discovered` and `fleet` fixtures; h1
router + engine-1, h2 engine-2 with a password, h3 engine-3). One scenario per test, since each step depends
on what the last installed."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli, prepare
from helpers.fleet_checkout import HOST_IDS, PASSWORD
from helpers.git_repo import git
from helpers.install import NAMES, as_host_user, manifest_of
from helpers.polling import wait_for

from narwhal_assets.cli.main import main
from narwhal_assets.protocols.install import DeploymentEntry

INSTALLATION = dg.AssetKey("host_installation")
ROLLBACK_STARTED = "rollback-started"


# --------------------------------------------------------------------------------------------- helpers


def new_revision(root: Path) -> str:
    """Commit a change in the management checkout and make it the revision `prepare` deploys."""
    (root / "app" / "version.py").write_text("VERSION = 2\n")
    git(root, "add", "app/version.py")
    git(root, "commit", "-q", "-m", "version 2")
    revision = git(root, "rev-parse", "HEAD")
    env = root / ".env"
    env.write_text(re.sub(r"^NARWHAL_DEPLOYMENT_REVISION=.*$", f"NARWHAL_DEPLOYMENT_REVISION='{revision}'",
                          env.read_text(), flags=re.M))  # fmt: skip
    return revision


def home(fleet: SimFleet, host_id: str) -> Path:
    return fleet.host(NAMES[host_id]).home / "Narwhal-deploy"


def current(fleet: SimFleet, host_id: str) -> str:
    return os.readlink(home(fleet, host_id) / "current")


def status_json(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    rc, out, err = cli(root, "status", "--json", *args, capsys=capsys)
    return rc, json.loads(out), err


def by_host(document: dict) -> dict[str, dict]:
    return {h["host"]: h for h in document["hosts"]}


def outcomes(out: str) -> dict[str, str]:
    found = re.finditer(r"^  (\S+)\s+roles=\S+\s+(installed|reused|activated|failed)", out, re.M)
    return {m.group(1): m.group(2) for m in found}


def partition_events(host_id: str) -> list[dict[str, object]]:
    """Every materialization of the host's partition, oldest first, as metadata values."""
    with dg.DagsterInstance.get() as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=INSTALLATION, asset_partitions=[host_id]), limit=100, ascending=True
        ).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records
            if r.asset_materialization is not None]  # fmt: skip


def latest_check() -> dg.AssetCheckEvaluation:
    with dg.DagsterInstance.get() as instance:
        key = dg.AssetCheckKey(INSTALLATION, "live_matches_installed")
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert record is not None and record.event is not None
    evaluation = record.event.dagster_event.event_specific_data
    assert isinstance(evaluation, dg.AssetCheckEvaluation)
    return evaluation


def current_shell(root: Path, role: str, command: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "narwhal_assets", "--root", str(root), "shell", "--current", "--role", role,
            "--command", command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def slow_git_under_lock(fleet: SimFleet, host_id: str, run: Path) -> Path:
    """Make git on the host hang while that deployment's lock is held (only `activate` holds it), announcing
    itself first: the test kills the host there. A replaced `git` on PATH, since a hook or fsmonitor in the
    checkout's git config never runs (git on the hosts runs with none). Returns the stand-in to remove."""
    host = fleet.host(NAMES[host_id])
    deployment = manifest_of(run).remote_dir
    fake = host.hostdir / "bin" / "git"
    fake.write_text(f'#!/bin/sh\nif [ -d "{host.remote_home}/{deployment}/.install-lock" ]; then '
                    f'touch "{host.remote_home}/{ROLLBACK_STARTED}"; sleep 120; fi\nexec /usr/bin/git "$@"\n')
    fake.chmod(0o755)
    return fake


# --------------------------------------------------------------------------------------------- tests


def test_status_rollback_and_prune_across_two_runs(
    discovered: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    unused = prepare(discovered, capsys)  # prepared, never installed: prune removes it from the workstation
    run_a = prepare(discovered, capsys)
    assert cli(discovered, "install", "--run", str(run_a), capsys=capsys)[0] == 0
    revision_a, id_a = manifest_of(run_a).revision, manifest_of(run_a).deployment_id
    revision_b = new_revision(discovered)
    run_b = prepare(discovered, capsys)
    id_b = manifest_of(run_b).deployment_id
    rc, out, err = cli(discovered, "install", "--run", str(run_b), capsys=capsys)
    assert rc == 0, out + err

    # status: B current everywhere, both directories installed and intact; the table and --json agree
    rc, out, err = cli(discovered, "status", capsys=capsys)
    assert rc == 0, out + err
    for host_id in HOST_IDS.values():
        assert re.search(rf"^{host_id}\s+\S+\s+{id_b[:12]}\s+{revision_b[:12]}\s+installed\s+intact\s+2$", out, re.M)
    rc, document, err = status_json(discovered, capsys)
    assert rc == 0, err
    for host_id, host in by_host(document).items():
        entries = {e.name: e for e in map(DeploymentEntry.model_validate, host["deployments"])}
        assert host["current"] == id_b == current(fleet, host_id)
        assert {(n, e.state, e.check, e.revision) for n, e in entries.items()} == {
            (id_a, "installed", "intact", revision_a), (id_b, "installed", "intact", revision_b)}
    with dg.DagsterInstance.get() as instance:
        [observed] = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=INSTALLATION, asset_partitions=["node-2"]), limit=1
        ).records
    assert observed.asset_observation is not None
    meta = observed.asset_observation.metadata
    assert (meta["live_deployment_id"].value, meta["live_revision"].value) == (id_b, revision_b)
    assert latest_check().passed

    # rollback to A: a tampered file in A's directory on node-2 refuses there only
    tampered = home(fleet, "node-2") / id_a / "checkout" / "runs" / "deployment" / ".env.engine-2"
    original = tampered.read_bytes()
    tampered.write_bytes(b"export TAMPERED=1\n")
    rc, out, err = cli(discovered, "rollback", "--run", str(run_a), "--activate", "each", capsys=capsys)
    assert rc == 1, out + err
    assert outcomes(out) == {"node-1": "activated", "node-2": "failed", "node-3": "activated"}
    assert "deploy-hosts rollback: host node-2 failed at gate 'verify file'" in err and ".env.engine-2" in err
    assert (current(fleet, "node-1"), current(fleet, "node-2"), current(fleet, "node-3")) == (id_a, id_b, id_a)
    assert tampered.read_bytes() == b"export TAMPERED=1\n"
    history = partition_events("node-1")
    assert [e["outcome"] for e in history] == ["installed", "installed", "activated"]
    assert (history[-1]["bytes_sent"], history[-1]["revision"], history[-1]["deployment_id"]) == (0, revision_a, id_a)
    assert history[-1]["who"].startswith("rollback by ") and history[-1]["run_dir"] == str(run_a)
    done = current_shell(discovered, "engine-1", "git rev-parse HEAD")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == revision_a

    rc, document, err = status_json(discovered, capsys, "--host", "node-2")
    assert rc == 1
    [entry] = [e for e in by_host(document)["node-2"]["deployments"] if e["name"] == id_a]
    assert entry["check"] == "tampered" and ".env.engine-2" in entry["problem"]
    assert f"host node-2: Narwhal-deploy/{id_a}: " in err
    tampered.write_bytes(original)

    # drift: current moved on the host behind Dagster's back; status names the host, the check fails
    link = home(fleet, "node-3") / "current"
    link.unlink()
    link.symlink_to(id_b)
    as_host_user(fleet, "h3", link)
    rc, out, err = cli(discovered, "status", capsys=capsys)
    assert rc == 1
    assert "host node-3: runs another deployment than the one last installed there" in err
    evaluation = latest_check()
    assert not evaluation.passed and evaluation.metadata["drifting_hosts"].value == "node-3"
    assert cli(discovered, "rollback", "--run", str(run_a), "--host", "node-3", capsys=capsys)[0] == 0
    assert current(fleet, "node-3") == id_a

    # a killed sshd mid-rollback (activate holds the lock, verifying) leaves current where it was
    slow_git = slow_git_under_lock(fleet, "node-3", run_b)
    started = fleet.host("h3").home / ROLLBACK_STARTED
    killed: list[str] = []

    def kill_when_started() -> None:
        wait_for(started.exists, "the rollback to reach activate on h3")
        fleet.kill_sshd("h3")
        killed.append("h3")

    killer = threading.Thread(target=kill_when_started)  # the command runs here: it installs signal handlers
    killer.start()
    try:
        rc = main(["--root", str(discovered), "rollback", "--run", str(run_b), "--host", "node-3"])
        killer.join(timeout=300)
        out, err = capsys.readouterr()
        assert killed == ["h3"] and rc == 1, out + err
        assert "deploy-hosts rollback: host node-3 failed" in err
        rc, document, err = status_json(discovered, capsys)  # the host is down: status says so, exit 1
        assert rc == 1 and by_host(document)["node-3"]["error"] and by_host(document)["node-1"]["current"] == id_a
        assert err.startswith("deploy-hosts status: host node-3: ")
    finally:
        killer.join(timeout=300)
        started.unlink(missing_ok=True)
        fleet.start_host("h3")
        slow_git.unlink()
    assert current(fleet, "node-3") == id_a

    # prune: the dry run changes nothing; then each host keeps only current, the unused prepared run goes
    before = {h: sorted(p.name for p in home(fleet, h).iterdir()) for h in HOST_IDS.values()}
    rc, out, err = cli(discovered, "prune", "--keep", "1", "--dry-run", capsys=capsys)
    assert rc == 0, out + err
    assert f"node-1     would remove ~/Narwhal-deploy/{id_b}" in out and f"would remove {unused}" in out
    assert {h: sorted(p.name for p in home(fleet, h).iterdir()) for h in HOST_IDS.values()} == before
    assert unused.is_dir()
    rc, out, err = cli(discovered, "prune", "--keep", "1", capsys=capsys)
    assert rc == 0, out + err
    for host_id in HOST_IDS.values():
        kept = current(fleet, host_id)
        assert sorted(p.name for p in home(fleet, host_id).iterdir()) == sorted(["current", kept]), out
    assert (current(fleet, "node-1"), current(fleet, "node-2")) == (id_a, id_b)
    assert not unused.exists() and run_a.is_dir() and run_b.is_dir()
    assert PASSWORD not in out + err
    assert stat.S_IMODE(home(fleet, "node-1").stat().st_mode) == 0o700


def test_rollback_to_a_run_not_on_the_host_offers_install(
    discovered: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, _out, err = cli(discovered, "prepare", "--out", str(tmp_path / "never-installed"), capsys=capsys)
    assert rc == 0, err
    run = tmp_path / "never-installed"
    rc, out, err = cli(discovered, "rollback", "--run", str(run), "--role", "engine-2", capsys=capsys)
    assert rc == 1, out + err
    assert (f"host node-2 failed at gate 'absent': ~/{manifest_of(run).remote_dir} is not on this host: run "
            f"deploy-hosts install --run {run}") in err  # fmt: skip
    assert not (fleet.host("h2").home / manifest_of(run).remote_dir).exists()
    with pytest.raises(SystemExit) as exited:
        main(["--root", str(discovered), "shell", "--current", "--run", str(run), "--role", "router"])
    assert exited.value.code == 2

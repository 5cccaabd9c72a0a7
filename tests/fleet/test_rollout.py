"""Install as one fleet operation on real sshd hosts: stage everywhere then activate together, a canary that
stops the rest, the lease on every host (refusal naming the holder, a stale lease taken over), and lines that say
what happened to `current`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli
from helpers.faults import gone
from helpers.install import (
    NAMES,
    OFFLINE_CHECK,
    SLOW_FLAG,
    STARTED_FLAG,
    as_host_user,
    install,
    manifest_of,
    remote_dir,
)
from helpers.polling import wait_for

from narwhal_assets.defs.partitions import host_partitions

pytestmark = pytest.mark.fleet
FAIL_FLAG = "fail-check"


@pytest.fixture(scope="module")
def root(discovered: Path) -> Path:
    """The discovered checkout, with a check command that fails on a host whose home holds FAIL_FLAG."""
    check = f'test ! -e "$HOME/{FAIL_FLAG}" && {OFFLINE_CHECK}'
    with (discovered / ".env").open("a", encoding="utf-8") as env:
        env.write("NARWHAL_REMOTE_CHECK='" + check.replace("'", "'\\''") + "'\n")
    return discovered


@contextmanager
def failing_check(fleet: SimFleet, name: str) -> Iterator[None]:
    """The check command fails on host `name` while this lasts."""
    flag = fleet.host(name).home / FAIL_FLAG
    flag.touch()
    try:
        yield
    finally:
        flag.unlink()


def current(fleet: SimFleet, host_id: str) -> str | None:
    link = fleet.host(NAMES[host_id]).home / "Narwhal-deploy" / "current"
    return os.readlink(link) if link.is_symlink() else None


def line(out: str, host_id: str) -> str:
    found = re.search(rf"^  {host_id}\s+roles=\S+\s+(.*)$", out, re.M)
    assert found, out
    return found.group(1)


def prepare(root: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    rc, _, err = cli(root, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, err
    return out


def test_one_failing_host_activates_none_and_the_rerun_sends_nothing_to_the_staged_hosts(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = manifest_of(prepared).deployment_id
    before = {h: current(fleet, h) for h in NAMES}
    with failing_check(fleet, "h2"):
        rc, out, err = install(root, prepared, capsys)
    assert rc == 1, out + err
    assert "none was activated: node-2 failed" in out, err
    assert line(out, "node-2").startswith("failed at gate 'check'")
    for host_id in ("node-1", "node-3"):
        assert line(out, host_id).startswith("staged, not activated (node-2 failed: no host was activated")
    assert {h: current(fleet, h) for h in NAMES} == before, "no host moved"
    with dg.DagsterInstance.get() as instance:  # what the UI shows: this run meant to install them and did not
        states = instance.get_status_by_partition(dg.AssetKey("host_installation"), list(NAMES), host_partitions)
        [run] = instance.get_runs(filters=dg.RunsFilter(job_name="install_job"), limit=1)
    assert states == dict.fromkeys(NAMES, dg.AssetPartitionStatus.FAILED), states
    assert run.status == dg.DagsterRunStatus.FAILURE and run.tags["dagster/asset_partition_range_start"] == "node-1"

    rc, out, err = install(root, prepared, capsys)
    assert rc == 0, out + err
    for host_id in ("node-1", "node-3"):
        assert re.match(r"reused, activated \(was \S+\) \(0 files, 0 bytes sent", line(out, host_id)), out
    assert line(out, "node-2").startswith("installed, activated")
    assert {h: current(fleet, h) for h in NAMES} == dict.fromkeys(NAMES, deployment)
    with dg.DagsterInstance.get() as instance:
        states = instance.get_status_by_partition(dg.AssetKey("host_installation"), list(NAMES), host_partitions)
    assert states == dict.fromkeys(NAMES, dg.AssetPartitionStatus.MATERIALIZED), states


def test_activate_each_moves_the_hosts_that_staged_and_a_failing_canary_stages_no_other_host(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    deployment = manifest_of(prepared).deployment_id
    with failing_check(fleet, "h2"):
        rc, out, _ = install(root, prepared, capsys, "--activate", "each")
    assert rc == 1
    assert (current(fleet, "node-1"), current(fleet, "node-3")) == (deployment, deployment)
    assert current(fleet, "node-2") != deployment and line(out, "node-2").startswith("failed at gate 'check'")

    canary_run = prepare(root, tmp_path / "canary", capsys)
    with failing_check(fleet, "h1"):
        rc, out, _ = install(root, canary_run, capsys, "--canary", "1")
    assert rc == 1
    for host_id in ("node-2", "node-3"):
        assert line(out, host_id).startswith("not staged")
        assert not remote_dir(fleet, host_id, canary_run).exists(), "a host after the failed canary was staged"


def test_rollback_then_install_says_current_moves_back(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    first = manifest_of(prepared).deployment_id
    assert install(root, prepared, capsys)[0] == 0
    newer = prepare(root, tmp_path / "newer", capsys)
    second = manifest_of(newer).deployment_id
    assert install(root, newer, capsys)[0] == 0
    rc, out, err = cli(root, "rollback", "--run", str(prepared), capsys=capsys)
    assert rc == 0, out + err
    assert all(line(out, h).startswith(f"activated (was {second})") for h in NAMES), out
    rc, out, err = install(root, newer, capsys)
    assert rc == 0, out + err
    assert all(line(out, h).startswith(f"reused, activated (was {first})") for h in NAMES), out
    rc, out, _ = install(root, newer, capsys)
    assert all(line(out, h).startswith("reused, already current") for h in NAMES), out
    with dg.DagsterInstance.get() as instance:  # the fleet table on the asset's latest unpartitioned observation
        records = instance.fetch_observations(dg.AssetKey("host_installation"), limit=10).records
    table = next(r.asset_observation for r in records if r.asset_observation and r.asset_observation.partition is None)
    rows = {row.data["host"]: row.data for row in table.metadata["fleet"].value.records}
    assert set(rows) == set(NAMES) and all(r["current"] == second[:12] and r["state"] == "already current"
                                           for r in rows.values()), rows  # fmt: skip


@contextmanager
def install_in_background(root: Path, run: Path, fleet: SimFleet, name: str, *args: str,
                          seconds: str = "") -> Iterator[subprocess.Popen[str]]:  # fmt: skip
    """`deploy-hosts install --run RUN ARGS` in a process (and session) of its own, yielded once host `name`'s
    install command has started and is slow (60 s, or `seconds`); the flags and whatever is left are cleaned up."""
    home = fleet.host(name).home
    flag, started = home / SLOW_FLAG, home / STARTED_FLAG
    flag.write_text(seconds)
    command = subprocess.Popen([sys.executable, "-m", "narwhal_assets", "--root", str(root), "install", "--run",
                                str(run), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        wait_for(started.exists, f"the slow install to start on {name}")
        yield command
    finally:
        flag.unlink(missing_ok=True)
        started.unlink(missing_ok=True)
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.communicate()


def plant_lease(fleet: SimFleet, name: str, expires: float, **holder: object) -> Path:
    """Another operation's lease record on host `name` (as `host/lease.py` writes it), owned by the host user."""
    record = fleet.host(name).home / "Narwhal-deploy" / ".lease"
    record.parent.mkdir(mode=0o700, exist_ok=True)
    fields = {"user": "bob", "workstation": "bobs-laptop", "command": "install", "revision": "b" * 40,
              "deployment_id": "f" * 32, "message": "hotfix", "since": "2026-12-02T00:00:00Z", "boot": "",
              "pid": 1, "pid_start": "", **holder}  # fmt: skip
    record.write_text(json.dumps({"schema": "narwhal.host-lease", "schema_version": 1, "token_sha256": "0" * 64,
                                  "holder": fields, "renewed": time.time(), "expires": expires}))  # fmt: skip
    for path in (record.parent, record):
        as_host_user(fleet, name, path)
    return record


def test_a_held_lease_on_any_host_refuses_naming_its_holder_and_an_expired_one_is_taken_over(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lease is on every host (here the second), not on the inventory's first: a held one anywhere refuses
    the whole operation before anything changed, and every lease it took is released."""
    record = plant_lease(fleet, "h2", time.time() + 3600)
    before = {h: current(fleet, h) for h in NAMES}
    rc, out, err = install(root, prepared, capsys)
    assert rc == 1, out + err
    assert "another operation holds the lease on node-2" in err and "nothing was changed" in err, err
    assert "host node-2: held: bob@bobs-laptop (install of bbbbbbbbbbbb as ffffffff" in err and '"hotfix"' in err
    assert {h: current(fleet, h) for h in NAMES} == before
    assert not any((fleet.host(NAMES[h]).home / "Narwhal-deploy" / ".lease").exists() for h in ("node-1", "node-3")), \
        "the leases taken on the other hosts were released"  # fmt: skip
    rc, out, _ = cli(root, "lease", capsys=capsys)
    assert rc == 0 and re.search(r"node-2 +held: bob@bobs-laptop", out) and re.search(r"node-1 +free", out), out
    rc, out, _ = cli(root, "lease", "--release", capsys=capsys)
    assert rc == 1 and re.search(r"node-2 +kept: held: bob@bobs-laptop", out), "a live lease is not released"

    plant_lease(fleet, "h2", time.time() - 60)  # bob's lease ran out
    rc, out, err = install(root, prepared, capsys)
    assert rc == 0, out + err
    assert "host node-2: took over the stale lease of bob@bobs-laptop" in out
    rc, out, _ = cli(root, "lease", capsys=capsys)
    assert all(re.search(rf"{h} +free", out) for h in NAMES), "the operation released every lease it held"

    os.mkfifo(record)  # a stuck record: deploys refuse it, `lock` says what it is, --force clears it
    as_host_user(fleet, "h2", record)
    rc, out, err = install(root, prepared, capsys)
    assert rc == 1 and "host node-2: stuck: is not a regular file (a FIFO" in err, err
    rc, out, _ = cli(root, "lease", capsys=capsys)
    assert rc == 1 and re.search(r"node-2 +stuck: is not a regular file", out), out
    rc, out, _ = cli(root, "lease", "--release", "--force", "--host", "node-2", capsys=capsys)
    assert rc == 0 and re.search(r"node-2 +cleared \.lease", out) and not os.path.lexists(record), out


def test_a_current_that_is_not_a_deployment_link_fails_staging_and_no_host_moves(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    link = fleet.host("h2").home / "Narwhal-deploy" / "current"
    link.parent.mkdir(mode=0o700, exist_ok=True)
    saved = os.readlink(link) if link.is_symlink() else None
    before = {h: current(fleet, h) for h in NAMES}
    try:
        link.unlink(missing_ok=True)
        link.write_text("not a link")
        as_host_user(fleet, "h2", link)
        rc, out, err = install(root, prepared, capsys)
        assert rc == 1, out + err
        assert line(out, "node-2").startswith("failed at gate 'current': current is not a symlink, not a link to a "
                                              "deployment (left as it is)")  # fmt: skip
        assert all(line(out, h).startswith("staged, not activated") for h in ("node-1", "node-3")), out
        assert {h: current(fleet, h) for h in ("node-1", "node-3")} == {h: before[h] for h in ("node-1", "node-3")}
        assert link.read_text() == "not a link", "left as it is"
    finally:
        link.unlink(missing_ok=True)
        if saved:
            link.symlink_to(saved)


def test_a_second_checkout_is_refused_on_any_shared_host_and_a_killed_one_stays_killed_until_rerun(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Leases hold across checkouts, whichever hosts they select; `lock --release` keeps a live operation's
    lease; SIGKILL of the holder stops everything it started (no worker lives on to activate), and its rerun on
    the same workstation takes the dead holder's leases over at once."""
    deployment = manifest_of(prepared).deployment_id
    other = tmp_path / "other-checkout"
    shutil.copytree(root, other, symlinks=True)
    with install_in_background(root, prepared, fleet, "h2", "--message", "first deploy") as first:
        rc, out, err = install(other, prepared, capsys)
        assert rc == 1, out + err
        assert "another operation holds the lease on node-1, node-2, node-3" in err and '"first deploy"' in err, err
        rc, out, err = install(other, prepared, capsys, "--role", "engine-3")  # only the host not being staged
        assert rc == 1 and "another operation holds the lease on node-3" in err, out + err
        rc, out, _ = cli(other, "lease", "--release", capsys=capsys)
        assert rc == 1 and re.search(r"node-2 +kept: held: .*\"first deploy\"", out), out
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate(timeout=30)
    assert gone(fleet, "h2", "sleep 60") == [], "the killed command's install went on on the host"
    assert not (remote_dir(fleet, "node-2", prepared) / "installed").exists()
    assert current(fleet, "node-2") != deployment

    rc, out, err = install(root, prepared, capsys)
    assert rc == 0, out + err
    assert "took over the stale lease of" in out
    assert {h: current(fleet, h) for h in NAMES} == dict.fromkeys(NAMES, deployment), "one deployment everywhere"
    with dg.DagsterInstance.get() as instance:  # the killed command's run no longer says it runs
        killed = [r for r in instance.get_runs(filters=dg.RunsFilter(job_name="install_job")) if r.tags.get(
                  "narwhal/pid") == str(first.pid)]  # fmt: skip
    assert killed and all(r.status == dg.DagsterRunStatus.FAILURE for r in killed), killed


@contextmanager
def short_leases(*roots: Path, seconds: int = 4) -> Iterator[None]:
    """Every checkout's operations hold leases of `seconds` while this lasts (NARWHAL_LEASE_S in .env), and
    their connections stay up through a pause far longer than that (keep-alives every 30 s: a pause shorter
    than the keep-alive window leaves the connection to the host's own fencing, which is what is tested)."""
    saved = {root: (root / ".env").read_bytes() for root in roots}
    try:
        for root in roots:
            with (root / ".env").open("a", encoding="utf-8") as env:
                env.write(f"NARWHAL_LEASE_S={seconds}\nNARWHAL_SSH_ALIVE_INTERVAL=30\n")
        yield
    finally:
        for root, data in saved.items():
            (root / ".env").write_bytes(data)


@pytest.mark.parametrize("phase", ["staging", "activating"])
def test_an_operation_paused_past_its_lease_changes_nothing_more_once_another_took_over(
    root: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path, phase: str
) -> None:
    """A (a laptop suspended: SIGSTOP) is paused past its lease while h2 stages, either while every host stages
    (`--activate all`) or in the middle of its activations (`--activate each --max-parallel 1`: node-1 already
    moved); B takes every host over and deploys its own run; A resumed (SIGCONT) is refused by each host it
    still tries to change (gate `lease`) and the fleet ends on B's deployment everywhere, never mixed."""
    other = tmp_path / "other-checkout"
    shutil.copytree(root, other, symlinks=True, ignore=shutil.ignore_patterns("deployment-env"))
    ours = manifest_of(prepared).deployment_id
    extra = ["--activate", "each", "--max-parallel", "1"] if phase == "activating" else []
    with short_leases(root, other):
        theirs_run = prepare(other, tmp_path / "theirs", capsys)
        theirs = manifest_of(theirs_run).deployment_id
        with install_in_background(root, prepared, fleet, "h2", *extra, seconds="15") as first:
            os.killpg(first.pid, signal.SIGSTOP)
            (fleet.host("h2").home / SLOW_FLAG).unlink()  # B's install of h2 is not slow
            if phase == "activating":
                assert current(fleet, "node-1") == ours, "A moved node-1 before it was paused"
            time.sleep(6)  # A's leases (4 s) run out while it is stopped
            rc, out, err = install(other, theirs_run, capsys)
            assert rc == 0, out + err
            assert out.count("took over the stale lease of") >= 1, out
            assert {h: current(fleet, h) for h in NAMES} == dict.fromkeys(NAMES, theirs)
            os.killpg(first.pid, signal.SIGCONT)
            out, err = first.communicate(timeout=120)
    assert first.returncode == 1, out + err
    assert line(out, "node-2").startswith("failed at gate 'lease': lease: this operation's lease here was taken "
                                          "over"), out  # fmt: skip
    assert {h: current(fleet, h) for h in NAMES} == dict.fromkeys(NAMES, theirs), "A changed a host it lost"
    assert not (remote_dir(fleet, "node-2", prepared) / "installed").exists(), "no marker without the lease"
    if phase == "staging":
        assert all(line(out, h).startswith("staged, not activated") for h in ("node-1", "node-3")), out
    else:
        assert line(out, "node-3").startswith("not staged"), out


def test_a_run_prepared_before_a_setting_changed_warns_naming_it_and_strict_refuses(
    root: Path, prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = root / ".env"
    original = env.read_bytes()
    try:
        with env.open("a", encoding="utf-8") as handle:
            handle.write("NARWHAL_ENGINE_MODEL_NAME=another-model\n")
        rc, out, err = install(root, prepared, capsys, "--strict")
        assert rc == 2 and "prepared before NARWHAL_ENGINE_MODEL_NAME changed" in err, out + err
        assert "another-model" not in out + err, "names, never values"
        rc, out, err = install(root, prepared, capsys)
        assert rc == 0, out + err
        assert "warning:" in err and "NARWHAL_ENGINE_MODEL_NAME" in err
    finally:
        env.write_bytes(original)
    rc, out, err = install(root, prepared, capsys)
    assert rc == 0 and "warning" not in err, err


def test_ctrl_c_says_where_each_host_stopped_without_a_traceback(
    root: Path, prepared: Path, fleet: SimFleet
) -> None:
    with install_in_background(root, prepared, fleet, "h3") as command:
        os.killpg(command.pid, signal.SIGINT)
        _, err = command.communicate(timeout=60)
    assert command.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "deploy-hosts install: host node-3: stopped while staging: `current` not moved" in err, err
    assert all(f"host {h}: stopped" in err for h in NAMES), err
    assert err.strip().splitlines()[-1].startswith("deploy-hosts install: interrupted by SIGINT")
    assert gone(fleet, "h3", "sleep 60") == []
    with dg.DagsterInstance.get() as instance:
        [run] = instance.get_runs(filters=dg.RunsFilter(tags={"narwhal/pid": str(command.pid)}))
        states = instance.get_status_by_partition(dg.AssetKey("host_installation"), list(NAMES), host_partitions)
    assert run.status == dg.DagsterRunStatus.CANCELED, run.status
    assert not {dg.AssetPartitionStatus.IN_PROGRESS, dg.AssetPartitionStatus.FAILED} & set(states.values()), \
        f"an interrupted install changed no host: no partition is in progress or failed ({states})"  # fmt: skip

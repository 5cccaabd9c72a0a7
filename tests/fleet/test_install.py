"""`deploy-hosts install` and role shells against real sshd hosts (issue: install), checked on each host.

Fleet and checkout as in the prepare tests: h1 (router + engine-1, key auth), h2 (engine-2, PASSWORD auth),
h3 (engine-3); the management checkout is a real git repository, discovered once per module (the `discovered`
and `prepared` fixtures, tests/fleet/conftest.py). Every test
runs a real `deploy-hosts prepare` into its own directory, so it installs into its own
`~/Narwhal-deploy/<id>/` and tests stay independent. The simulated hosts have no network: the install
command links the checkout into the virtualenv with a `.pth` file and the check imports from there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pexpect
import pytest
from fleetsim import SimFleet, system
from helpers.dagster_dev import as_an_operator_starts_it, stop_group
from helpers.faults import GUARD, KEEPALIVE_LOST, gone, host_tool
from helpers.files import assert_nowhere, source_env
from helpers.fleet_checkout import DESTINATIONS, HOST_IDS, PASSWORD
from helpers.install import (
    SLOW_FLAG,
    STARTED_FLAG,
    as_host_user,
    install,
    manifest_of,
    outcomes,
    partition_metadata,
    remote_dir,
)
from helpers.loopback import free_port
from helpers.polling import wait_for

from narwhal_assets.cli.main import main

# --------------------------------------------------------------------------------------------- helpers


def git_head(checkout: Path) -> str:
    done = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(checkout), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def role_shell(root: Path, run: Path, role: str, command: str) -> subprocess.CompletedProcess[str]:
    """`deploy-hosts shell --run --role --command` in a child process (it execs OpenSSH)."""
    argv = [sys.executable, "-m", "narwhal_assets", "--root", str(root), "shell", "--run", str(run), "--role", role,
            "--command", command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


# --------------------------------------------------------------------------------------------- tests


def test_full_install_then_reuse_sends_nothing(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = manifest_of(prepared)
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, out + err
    assert outcomes(out) == {"node-1": "installed", "node-2": "installed", "node-3": "installed"}
    for host in manifest.hosts:
        base = remote_dir(fleet, host.id, prepared)
        checkout = base / "checkout"
        assert (base / "installed").read_bytes() == manifest.revision.encode() + b"\n"
        assert git_head(checkout) == manifest.revision
        assert (base / "source.bundle").read_bytes() == (prepared / "source.bundle").read_bytes()
        assert stat.S_IMODE(base.stat().st_mode) == 0o700
        assert not (base / ".install-lock").exists()
        for prepared_file in host.files:
            sent = (prepared / prepared_file.path).read_bytes()
            assert prepared_file.install_to is not None
            placed = checkout / prepared_file.install_to
            assert placed.read_bytes() == sent, placed
            assert stat.S_IMODE(placed.stat().st_mode) == 0o600
            assert stat.S_IMODE(placed.parent.stat().st_mode) == 0o700
        assert (checkout / ".venv" / "bin" / "python").exists()
        assert not [p.name for p in base.iterdir() if ".part-" in p.name]
        meta = partition_metadata(host.id)
        assert meta["outcome"] == "installed" and meta["revision"] == manifest.revision
        assert meta["bytes_sent"] == sum(f.size for f in host.files) + manifest.bundle.size
    colocated = remote_dir(fleet, "node-1", prepared) / "checkout" / "runs" / "deployment"
    placed = {p.name for p in colocated.iterdir()}
    assert {".env.router", ".env.engine-1", "fleet.json", "profiling-limits.json"} <= placed
    log = prepared / "logs" / "node-2.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    text = log.read_text(encoding="utf-8")
    assert "--- exit status 0 ---" in text and "host ran: git clone" in text
    stored = re.findall(r"^--- program (programs/[0-9a-f]{64}\.py) with ", text, re.M)
    assert stored and len(set(stored)) == 1, "each call names the program it ran, stored once per prepared run"
    program = prepared / "logs" / stored[0]
    assert "def main(params_json" in program.read_text() and stat.S_IMODE(program.stat().st_mode) == 0o600
    assert manifest.revision in text and '"token"' not in text, "the parameters are logged, the lease token never"
    first_size = log.stat().st_size

    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, out + err
    assert outcomes(out) == {"node-1": "reused", "node-2": "reused", "node-3": "reused"}
    for host in manifest.hosts:
        meta = partition_metadata(host.id)
        assert (meta["outcome"], meta["bytes_sent"], meta["files_sent"]) == ("reused", 0, 0)
    assert log.read_text(encoding="utf-8").startswith(text), "the log is appended to"
    assert log.stat().st_size - first_size <= 4096, "a reuse adds one short entry per host"
    # Worker processes ran the partitions' runs; each closed its databases (checkpointed) before leaving.
    with dg.DagsterInstance.get() as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"narwhal/command": "install"}))
    events = Path(os.environ["DAGSTER_HOME"]) / "history" / "runs"
    # one install_job run per command (a run per host before), each with its own event log
    assert len(runs) == 2 and all((events / f"{run.run_id}.db").is_file() for run in runs)
    assert not [run.run_id for run in runs if (events / f"{run.run_id}.db-wal").exists()], sorted(events.iterdir())
    assert_nowhere([PASSWORD, *DESTINATIONS.values()], [prepared, discovered / "runs", discovered / "config",
                                                        Path(os.environ["DAGSTER_HOME"])])  # fmt: skip
    assert_nowhere([PASSWORD, *DESTINATIONS.values()],
                   [remote_dir(fleet, h.id, prepared) for h in manifest.hosts])  # fmt: skip
    assert PASSWORD not in out + err and not any(d in out + err for d in DESTINATIONS.values())


def test_tampered_remote_file_stops_only_that_host(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install(discovered, prepared, capsys)[0] == 0
    target = remote_dir(fleet, "node-2", prepared) / "checkout" / "runs" / "deployment" / ".env.engine-2"
    target.write_bytes(b"export TAMPERED=1\n")
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 1
    assert outcomes(out) == {"node-1": "reused", "node-2": "failed", "node-3": "reused"}
    assert "host node-2 failed at gate 'verify file'" in err and ".env.engine-2" in err
    assert target.read_bytes() == b"export TAMPERED=1\n", "a mismatch leaves the host's content as it was"
    assert partition_metadata("node-3")["outcome"] == "reused"
    with dg.DagsterInstance.get() as instance:
        [observed] = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("host_installation"), asset_partitions=["node-2"]), limit=1
        ).records
    assert observed.asset_observation is not None
    assert observed.asset_observation.metadata["outcome"].value == "failed: verify file"

    link = remote_dir(fleet, "node-3", prepared) / "source.bundle"
    link.unlink()
    link.symlink_to("/etc/hostname")
    rc, out, err = install(discovered, prepared, capsys, "--host", "node-3")
    assert rc == 1 and "host node-3 failed at gate 'verify file': source.bundle is a symlink" in err
    assert link.is_symlink()


def test_held_lock_fails_only_that_host(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    base = remote_dir(fleet, "node-3", prepared)
    for directory in (base.parent, base, base / ".install-lock"):
        directory.mkdir(mode=0o700, exist_ok=True)
        as_host_user(fleet, "h3", directory)
    rc, out, err = install(discovered, prepared, capsys, "--activate", "each")  # per-host activation
    assert rc == 1
    assert outcomes(out) == {"node-1": "installed", "node-2": "installed", "node-3": "failed"}
    assert "host node-3 failed at gate 'lock': .install-lock is held by" in err
    assert (base / ".install-lock").is_dir() and not (base / "installed").exists()
    (base / ".install-lock").rmdir()
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, err
    assert outcomes(out) == {"node-1": "reused", "node-2": "reused", "node-3": "installed"}


def test_edited_effective_fleet_survives_a_reinstall(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install(discovered, prepared, capsys, "--role", "router")[0] == 0
    base = remote_dir(fleet, "node-1", prepared)
    effective = base / "checkout" / "runs" / "deployment" / "fleet.json"
    edited = effective.read_bytes().replace(b'"decode"', b'"prefill"') + b"\n"
    effective.write_bytes(edited)
    assert install(discovered, prepared, capsys, "--role", "router")[0] == 0
    (base / "installed").unlink()  # a full install pass over the existing checkout keeps the edit too
    rc, out, err = install(discovered, prepared, capsys, "--role", "router")
    assert rc == 0, err
    assert outcomes(out) == {"node-1": "installed"}
    assert effective.read_bytes() == edited


def test_role_selection_contacts_only_its_host(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = install(discovered, prepared, capsys, "--role", "engine-1")
    assert rc == 0, err
    assert outcomes(out) == {"node-1": "installed"}
    assert (remote_dir(fleet, "node-1", prepared) / "installed").exists()
    for host_id in ("node-2", "node-3"):
        assert not remote_dir(fleet, host_id, prepared).exists()
        assert not (prepared / "logs" / f"{host_id}.log").exists()
    rc, _, err = install(discovered, prepared, capsys, "--role", "engine-9", "--role", "chef")
    assert rc == 2 and "--role engine-9" in err and "--role chef" in err
    rc, _, err = install(discovered, prepared, capsys, "--host", "node-7")
    assert rc == 2 and "--host node-7" in err
    with pytest.raises(SystemExit) as exited:
        main(["--root", str(discovered), "install", "--run", str(prepared), "--host", "node-1", "--role", "router"])
    assert exited.value.code == 2


def test_changed_destination_or_prepared_file_refuses_before_any_connection(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    role_file = prepared / "node-2" / ".env.engine-2"
    original = role_file.read_bytes()
    role_file.write_bytes(original + b"export EXTRA=1\n")
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 2, out + err
    assert f"{role_file}: size" in err and "prepare a new run" in err
    role_file.write_bytes(original)

    env = discovered / ".env"
    saved = env.read_bytes()
    # the same host under another alias: a changed destination, even though it would reach the same machine
    alias = DESTINATIONS["h3"] + "-renamed"
    config = Path(re.search(rb"NARWHAL_SSH_CONFIG=(\S+)", saved).group(1).decode())  # type: ignore[union-attr]
    config_saved = config.read_bytes()
    try:
        config.write_bytes(config_saved.replace(f"Host {DESTINATIONS['h3']}\n".encode(),
                                                f"Host {DESTINATIONS['h3']} {alias}\n".encode()))  # fmt: skip
        env.write_bytes(saved.replace(DESTINATIONS["h3"].encode(), alias.encode()))
        rc, out, err = install(discovered, prepared, capsys)
        assert rc == 2, out + err
        assert "hosts[node-3].destination_sha256: the destination in NARWHAL_NODE_3_SSH changed" in err
        assert alias not in err + out and DESTINATIONS["h3"] not in err + out
    finally:
        env.write_bytes(saved)
        config.write_bytes(config_saved)
    for host_id in HOST_IDS.values():
        assert not remote_dir(fleet, host_id, prepared).exists(), "nothing was contacted"
    assert not (prepared / "logs").exists()


def install_while_h3_fails(
    discovered: Path, prepared: Path, fleet: SimFleet, fault: Callable[[], None], repair: Callable[[], None]
) -> int:
    """`deploy-hosts install` with `fault()` striking h3 once its slow install command runs; `repair()` after."""
    home = fleet.host("h3").home
    flag, started = home / SLOW_FLAG, home / STARTED_FLAG
    flag.touch()
    result: dict[str, int] = {}
    worker = threading.Thread(target=lambda: result.update(rc=main(["--root", str(discovered), "install", "--run",
                                                                     str(prepared), "--activate",
                                                                     "each"])))  # fmt: skip
    try:
        worker.start()
        wait_for(started.exists, "the slow install to start on h3")
        fault()
        worker.join(timeout=300)
        assert not worker.is_alive()
    finally:
        flag.unlink()
        started.unlink(missing_ok=True)
        repair()
    return result["rc"]


def assert_rerun_completes_h3(discovered: Path, prepared: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rerun after h3 failed mid-install: the others reused, h3 installed, no lock or temporary left in `base`."""
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, out + err
    assert outcomes(out) == {"node-1": "reused", "node-2": "reused", "node-3": "installed"}
    assert (base / "installed").read_bytes() == manifest_of(prepared).revision.encode() + b"\n"
    assert not (base / ".install-lock").exists()
    assert not [str(p) for p in base.rglob("*.part-*")], "temporary files were left behind"


def test_killed_host_mid_install_leaves_no_marker_and_a_rerun_completes(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = install_while_h3_fails(discovered, prepared, fleet, lambda: fleet.kill_sshd("h3"),
                                lambda: fleet.start_host("h3"))  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert outcomes(out) == {"node-1": "installed", "node-2": "installed", "node-3": "failed"}
    base = remote_dir(fleet, "node-3", prepared)
    assert not (base / "installed").exists()
    lock = base / ".install-lock"
    if lock.is_dir():  # SIGKILL leaves it behind (under load the installer may see its session close first)
        owner = json.loads((lock / "owner.json").read_text())
        assert not system.is_running(owner["pid"]), "the lock's owner still runs on a killed host"
    rc, out, err = install(discovered, prepared, capsys)
    assert rc == 0, out + err
    assert outcomes(out) == {"node-1": "reused", "node-2": "reused", "node-3": "installed"}
    assert (base / "installed").read_bytes() == manifest_of(prepared).revision.encode() + b"\n"


def test_cut_link_mid_install_fails_that_host_by_keepalive_and_a_rerun_completes(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """h3's link goes down while its install command runs: the keep-alive window (1 s x 3), not the 600 s
    command timeout, fails that host alone, in one line. The host cannot hear the close, so its installer
    runs on until its guard sees the connection go (once the link is back, well before its 60 s install
    command ends) and stops it before the marker; its lock is released or stale, so the rerun installs h3
    and reuses the others."""
    monkeypatch.setenv("NARWHAL_SSH_ALIVE_INTERVAL", "1")
    monkeypatch.setenv("NARWHAL_SSH_ALIVE_COUNT", "3")
    rc = install_while_h3_fails(discovered, prepared, fleet, lambda: fleet.cut_link("h3"),
                                lambda: fleet.restore_link("h3"))  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert outcomes(out) == {"node-1": "installed", "node-2": "installed", "node-3": "failed"}
    assert err.splitlines() == [f"deploy-hosts install: host node-3 failed at gate 'connection': host node-3 "
                                f"({fleet.host('h3').address}:22): {KEEPALIVE_LOST}"]  # fmt: skip
    base = remote_dir(fleet, "node-3", prepared)
    assert not (base / "installed").exists()
    assert not gone(fleet, "h3", SLOW_FLAG, GUARD, patience=300), "the cut-off installer never ended"
    assert not (base / "installed").exists(), "the cut-off installer wrote the marker"

    assert_rerun_completes_h3(discovered, prepared, base, capsys)
    assert [partition_metadata(h)["bytes_sent"] for h in ("node-1", "node-2")] == [0, 0]


def test_killed_host_mid_clone_leaves_temporaries_that_the_rerun_removes(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """h3 dies (SIGKILL, sshd and every process) while its installer holds a half-made `checkout.part-<pid>`:
    the host fails in one line, no marker; the rerun takes the stale lock over, removes what the dead
    installer left and completes h3."""
    started = fleet.host("h3").home / STARTED_FLAG
    # git runs with HOME=/dev/null on the host (no global config): the account's home comes from passwd
    stall_after_clone = (f'#!/bin/sh\n/usr/bin/git "$@" || exit\n[ "$1" = clone ] || exit 0\n'
                         f'touch "$(getent passwd "$(id -un)" | cut -d: -f6)/{STARTED_FLAG}"\nexec sleep 3600\n')
    result: dict[str, int] = {}
    worker = threading.Thread(target=lambda: result.update(rc=main(["--root", str(discovered), "install", "--run",
                                                                     str(prepared), "--activate",
                                                                     "each"])))  # fmt: skip
    try:
        with host_tool(fleet, "h3", "git", stall_after_clone):
            worker.start()
            wait_for(started.exists, "the clone on h3")
            fleet.kill_sshd("h3")
            worker.join(timeout=300)
            assert not worker.is_alive()
    finally:
        started.unlink(missing_ok=True)
        fleet.start_host("h3")
    out, err = capsys.readouterr()
    assert result["rc"] == 1, out + err
    assert outcomes(out) == {"node-1": "installed", "node-2": "installed", "node-3": "failed"}
    [line] = err.splitlines()
    assert line.startswith("deploy-hosts install: host node-3 failed at gate 'connection': host node-3 ("), line
    base = remote_dir(fleet, "node-3", prepared)
    assert not (base / "installed").exists() and (base / ".install-lock").is_dir()
    assert [p.name for p in base.glob("checkout.part-*")], "the dead installer's half-made checkout"

    assert_rerun_completes_h3(discovered, prepared, base, capsys)


def test_role_shells_load_only_their_own_environment(
    discovered: Path, prepared: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install(discovered, prepared, capsys)[0] == 0
    for role, host_id in (("engine-1", "node-1"), ("engine-2", "node-2")):  # key and password authentication
        expected = source_env(prepared / host_id / f".env.{role}")["NARWHAL_ENGINE_PORT"]
        done = role_shell(discovered, prepared, role, 'printf %s "$NARWHAL_ENGINE_PORT"')
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected
    done = role_shell(discovered, prepared, "router", 'printf "%s|%s|%s" "${NARWHAL_ENGINE_PORT-unset}" "$PWD" '
                      '"$(command -v python)"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    port, cwd, python = done.stdout.split("|")
    checkout = f"{fleet.host('h1').remote_home}/{manifest_of(prepared).remote_dir}/checkout"
    assert (port, cwd, python) == ("unset", checkout, f"{checkout}/.venv/bin/python")
    assert PASSWORD not in done.stdout + done.stderr

    # interactive, with a TTY, on the password host: only engine-2's variables, the venv active
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    child = pexpect.spawn(sys.executable, ["-m", "narwhal_assets", "--root", str(discovered), "shell", "--run",
                                           str(prepared), "--role", "engine-2"], env=env, encoding="utf-8",
                          timeout=60)  # fmt: skip
    try:
        child.sendline('echo "marker:$NARWHAL_ENGINE_PORT:${NARWHAL_ROUTER_URL-unset}:${VIRTUAL_ENV##*/}:$-"')
        expected = source_env(prepared / "node-2" / ".env.engine-2")["NARWHAL_ENGINE_PORT"]
        child.expect(f"marker:{re.escape(expected)}:unset:.venv:[a-zA-Z]*i[a-zA-Z]*\r")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_shell_refuses_a_run_that_is_not_installed_there(
    discovered: Path, prepared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = role_shell(discovered, prepared, "engine-3", "true")
    assert done.returncode == 1
    assert "is not installed here: run deploy-hosts install" in done.stderr


def test_dagster_cli_materializes_one_partition(
    discovered: Path, prepared: Path, fleet: SimFleet, tmp_path: Path
) -> None:
    dagster = Path(sys.executable).parent / "dagster"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    env.update(NARWHAL_ROOT=str(discovered), DAGSTER_HOME=str(tmp_path / "ci-dagster"))
    (tmp_path / "ci-dagster").mkdir()
    config = json.dumps({"ops": {"host_installation": {"config": {"run_dir": str(prepared)}}}})
    with dg.DagsterInstance.from_config(str(tmp_path / "ci-dagster")) as instance:
        instance.add_dynamic_partitions("narwhal_hosts", ["node-1", "node-2", "node-3"])
    done = subprocess.run(
        [str(dagster), "asset", "materialize", "-m", "narwhal_assets.definitions", "--select", "host_installation",
         "--partition", "node-1", "--config-json", config],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (remote_dir(fleet, "node-1", prepared) / "installed").exists()
    assert not remote_dir(fleet, "node-2", prepared).exists()
    shutil.rmtree(tmp_path / "ci-dagster")


@pytest.fixture(autouse=True)
def _no_leftover_flags(fleet: SimFleet) -> Iterator[None]:
    yield
    for name in HOST_IDS:
        (fleet.host(name).home / SLOW_FLAG).unlink(missing_ok=True)


def test_ui_backfill_over_all_partitions_installs_every_host(
    discovered: Path, fleet: SimFleet, tmp_path: Path
) -> None:
    """`dagster dev` (webserver and daemon): a backfill of host_installation over every partition, launched
    through the UI's GraphQL API, installs the run that `prepare` recorded last (lineage, no run config)."""
    repo = Path(__file__).resolve().parents[2]
    home = tmp_path / "ui-dagster"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    env.update(NARWHAL_ROOT=str(discovered), DAGSTER_HOME=str(home))
    bin_dir = Path(sys.executable).parent
    argv = [str(bin_dir / "deploy-hosts"), "--root", str(discovered), "prepare", "--out", str(tmp_path / "ui-run")]
    prepared = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert prepared.returncode == 0, prepared.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("narwhal_hosts", list(HOST_IDS.values()))
    port = free_port()
    server = subprocess.Popen([str(bin_dir / "dagster"), "dev", "-w", str(repo / "workspace.yaml"), "-h",
                               "127.0.0.1", "-p", str(port)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True,
                              preexec_fn=as_an_operator_starts_it)  # fmt: skip
    try:
        wait_for(lambda: _graphql(port, "{ version }") is not None, "the webserver", limit=300)
        launched = _graphql(port, LAUNCH_BACKFILL)
        assert launched is not None
        backfill_id = launched["launchPartitionBackfill"]["backfillId"]

        def finished() -> bool:
            answer = _graphql(port, BACKFILL_STATUS % json.dumps(backfill_id))
            return answer is not None and answer["partitionBackfillOrError"]["status"] not in ("REQUESTED",)

        wait_for(finished, "the backfill", limit=900)
        answer = _graphql(port, BACKFILL_STATUS % json.dumps(backfill_id))
        assert answer is not None and answer["partitionBackfillOrError"]["status"] == "COMPLETED_SUCCESS", answer
    finally:
        stop_group(server)  # SIGTERM, then until no member is left (dagster dev's own bound is 2 x 60 s)
    for host_id in HOST_IDS.values():
        assert (remote_dir(fleet, host_id, tmp_path / "ui-run") / "installed").exists()


LAUNCH_BACKFILL = """mutation { launchPartitionBackfill(backfillParams: {
  assetSelection: [{path: ["host_installation"]}], allPartitions: true}) {
  ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_STATUS = "{ partitionBackfillOrError(backfillId: %s) { ... on PartitionBackfill { status } } }"


def _graphql(port: int, query: str) -> dict | None:
    """POST one GraphQL query to the local webserver; None while it does not answer."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # loopback only
            return json.loads(response.read())["data"]
    except (OSError, ValueError, KeyError):
        return None

"""The rediscovery (drift) sensor against real sshd hosts: no drift, a changed checkpoint file or image id, a
rotated host key; and the real Dagster daemon launching a discovery on drift.

Reuses the discovery tests' model fleet and checkout (the `fleet` and `checkout` fixtures: h1 router +
engine-1, h2 password engine-2, h3 engine-3), on a fleet of this module's own (the key rotation test changes
a host for good, so it runs last).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import InstigatorTick, TickStatus
from fleetsim import SimFleet
from fleetsim.hardware import image_inspect_object, write_tools
from helpers.deploy_hosts import discover
from helpers.files import known_hosts_fingerprints, replaced_file
from helpers.fleet_checkout import MODEL, PASSWORD, TOUCHED, WEIGHTS

from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.defs.sensors import rediscovery_sensor

defs = code_location()  # the code location as Dagster loads it

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NEW_IMAGE = "sha256:" + "d1" * 32
DAEMON_LIMIT_S = 480.0  # per step; a launched run loads the code location per step on 2 shared CPUs


def tick(root: Path) -> dg.SensorExecutionData:
    """One evaluation of the drift sensor against the instance the CLI discovery used (DAGSTER_HOME)."""
    with dg.DagsterInstance.get() as instance:
        resources = {"checkout": ManagementCheckout(root=str(root)), "ssh": SshSettings()}
        context = dg.build_sensor_context(instance=instance, definitions=defs, resources=resources)
        return rediscovery_sensor.evaluate_tick(context)


@contextmanager
def image_replaced(fleet: SimFleet, name: str, image_id: str) -> Iterator[None]:
    """The host's `docker` now reports another id for the engine image (as after `docker pull` of a new build)."""
    host = fleet.host(name)
    write_tools(host.hostdir / "bin", host.gpus, [image_inspect_object(image_id, host.image_ref)])
    try:
        yield
    finally:
        write_tools(host.hostdir / "bin", host.gpus, [image_inspect_object(host.image_id, host.image_ref)])


def test_no_drift_skips_saying_what_was_checked(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = discover(checkout, capsys)
    data = tick(checkout)
    assert not data.run_requests
    message = data.skip_message
    assert message.startswith(f"no drift on node-1, node-2, node-3 against {run.name}: checked host key")
    files = len(WEIGHTS) + 2  # config.json and the tokenizer.json link
    config = len((fleet.model_path("h1", MODEL) / "config.json").read_bytes())
    assert f"({3 * files} checkpoint files statted, {3 * config} bytes of config.json read)" in message
    [observation] = data.asset_events
    assert observation.metadata["unchanged"].value == ["node-1", "node-2", "node-3"]
    assert PASSWORD not in message


def test_a_changed_checkpoint_file_and_image_id_request_a_tagged_discovery(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    touched = fleet.model_path("h2", MODEL) / TOUCHED
    with replaced_file(touched, WEIGHTS[TOUCHED][::-1]), image_replaced(fleet, "h3", NEW_IMAGE):
        data = tick(checkout)
        again = tick(checkout)
    [request] = data.run_requests
    assert request.tags["narwhal/drift.node-2"] == "checkpoint"
    assert request.tags["narwhal/drift.node-3"] == "image"
    assert "narwhal/drift.node-1" not in request.tags and request.tags["narwhal/trigger"] == "drift"
    assert again.run_requests[0].run_key == request.run_key, "the same drift requests the same run"
    drift = data.asset_events[0].metadata["drift"].value
    assert drift["node-2"] == [f"checkpoint: engine-2: 1 file(s) changed: {TOUCHED}"]
    assert drift["node-3"] == [f"image: {fleet.host('h3').image_id} -> {NEW_IMAGE}"]


def test_the_daemon_launches_a_discovery_on_drift_and_skips_without(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`dagster-daemon run` for a bounded time: a skipped tick, then a changed file, then a drift run that succeeds."""
    discover(checkout, capsys)
    home = Path(os.environ["DAGSTER_HOME"])
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "DAGSTER_HOME": str(home), "NARWHAL_ROOT": str(checkout),
           "NARWHAL_REDISCOVERY_INTERVAL": "5s"}  # fmt: skip
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(f"load_from:\n  - python_module:\n      module_name: narwhal_assets.definitions\n"
                         f"      working_directory: {REPO}\n")  # fmt: skip
    cwd = tmp_path / "elsewhere"  # no .env here: the dagster CLI would load it into its environment
    cwd.mkdir()
    started = subprocess.run([str(BIN / "dagster"), "sensor", "start", "rediscovery_sensor", "-w", str(workspace)],
                             cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    log_path = tmp_path / "daemon.log"
    log = log_path.open("wb")
    daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], cwd=cwd, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        with dg.DagsterInstance.get() as instance:
            skipped = wait_for(lambda: skipped_after(instance, 0.0), log_path)
            assert skipped[0].skip_reason.startswith("no drift on node-1, node-2, node-3")
            assert not drift_runs(instance)
            with ExitStack() as stack:  # a new checkpoint version on every replica, so discovery can succeed
                for name in ("h1", "h2", "h3"):
                    stack.enter_context(replaced_file(fleet.model_path(name, MODEL) / TOUCHED, WEIGHTS[TOUCHED][::-1]))
                [run] = wait_for(lambda: drift_runs(instance), log_path)
                assert run.job_name == "discovery_job"
                assert {run.tags[f"narwhal/drift.node-{n}"] for n in (1, 2, 3)} == {"checkpoint"}
                done = wait_for(lambda: finished(instance, run.run_id), log_path)
                status = done.dagster_run.status
                assert status == dg.DagsterRunStatus.SUCCESS, log_path.read_text(errors="replace")[-4000:]
                # The new discovery saw the changed file: the next tick finds no drift again.
                after = wait_for(lambda: skipped_after(instance, done.end_time or 0.0), log_path)
                assert after[0].skip_reason.startswith("no drift")
                assert len(drift_runs(instance)) == 1
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()


def test_a_rotated_host_key_is_drift_and_a_refusal_never_an_enrolment(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    store = checkout / "config" / "ssh.known_hosts"
    before = store.read_bytes()
    fleet.rotate_host_key("h3")
    data = tick(checkout)
    [request] = data.run_requests
    assert request.tags["narwhal/drift.node-3"] == "host-key" and "narwhal/drift.node-1" not in request.tags
    [line] = data.asset_events[0].metadata["drift"].value["node-3"]
    assert line.startswith("host-key: ") and "refused; discovery will not enrol it" in line
    assert store.read_bytes() == before
    new = set(fleet.host("h3").host_key_fingerprints().values())
    assert not new & known_hosts_fingerprints(store)[fleet.host("h3").address]


# --------------------------------------------------------------------------------------------- daemon helpers


def wait_for(probe: Callable[[], object], log: Path) -> object:
    """Poll until `probe()` is truthy, within the daemon test's time bound; else fail showing the daemon's log."""
    deadline = time.monotonic() + DAEMON_LIMIT_S
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1)
    tail = log.read_text(errors="replace")[-4000:]
    raise AssertionError(f"nothing within {DAEMON_LIMIT_S:.0f} s; daemon log ends:\n{tail}")


def sensor_ticks(instance: dg.DagsterInstance) -> list[InstigatorTick]:
    states = [s for s in instance.all_instigator_state() if s.instigator_name == "rediscovery_sensor"]
    return [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def skipped_after(instance: dg.DagsterInstance, since: float) -> list[InstigatorTick]:
    return [t for t in sensor_ticks(instance) if t.status == TickStatus.SKIPPED and t.timestamp > since]


def drift_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={"narwhal/trigger": "drift"})))


def finished(instance: dg.DagsterInstance, run_id: str) -> dg.RunRecord | None:
    record = instance.get_run_record_by_id(run_id)
    return record if record is not None and record.dagster_run.is_finished else None

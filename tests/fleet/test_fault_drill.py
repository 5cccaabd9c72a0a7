"""The discovery fault drill: one `deploy-hosts discover` on an 8-host fleet while one host's sshd is dead, another's
link is cut mid-probe, a third presents a new host key and the disk under Dagster's storage fills up.

Each fault must be visible in that one run, so they are placed where each one bites:
- h5's sshd is killed before the run: connecting is refused;
- h6 is probed normally until its (stalled) nvidia-smi has started, then its link is cut: the keep-alive
  window (2 s x 3) ends it, long before the probe's 1800 s timeout;
- h7 was re-keyed since the last discovery: its key is refused as changed, nothing is sent to it;
- the filesystem holding `DAGSTER_HOME` is filled at the same moment as h6's cut, after the run started and
  while hosts are being probed: the run directory (on the checkout's disk) still receives the healthy
  hosts' results, while recording the run's outcome in Dagster's storage fails.
The command runs as a subprocess, as an operator runs it; its wall time is bounded against the configured
host timeout (each host's connect plus all its work), which the faults must not reach.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import run_dirs
from helpers.faults import STALL, host_tool, small_filesystem, started_marker, when_started
from helpers.files import read_json, snapshot
from helpers.fleet_checkout import MODEL, MODEL_CONFIG, WEIGHTS, make_checkout

HOSTS = [f"h{n}" for n in range(1, 9)]
ROLES = {"router": "h1", **{f"engine-{n}": f"h{n}" for n in range(1, 9)}}
KILLED, CUT, REKEYED = "h5", "h6", "h7"
HEALTHY = [name for name in HOSTS if name not in (KILLED, CUT, REKEYED)]
HOST_TIMEOUT_S = 300  # NARWHAL_SSH_HOST_TIMEOUT: no host may take longer, whatever it does
BOUNDS = {"NARWHAL_SSH_ALIVE_INTERVAL": "2", "NARWHAL_SSH_ALIVE_COUNT": "3",
          "NARWHAL_SSH_HOST_TIMEOUT": str(HOST_TIMEOUT_S)}  # fmt: skip
KEEPALIVE_LOST = "connection lost: no reply to keep-alive within 6 s (2 s x 3)"  # a loaded machine answers in time
STARTUP_ALLOWANCE_S = 120  # interpreter, Dagster and the definitions loading on a loaded machine


def host_id(name: str) -> str:
    return f"node-{name[1:]}"  # each host holds the engine of its number (h1 also the router)


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    fleet = sim_fleet_factory()
    for name in HOSTS:
        fleet.add_host(name)
    fleet.start()
    fleet.write_model(MODEL, WEIGHTS, MODEL_CONFIG)
    return fleet


@pytest.fixture
def checkout(tmp_path: Path, fleet: SimFleet) -> Path:
    """The discovery tests' checkout settings, with the fleet's own aliases as the 8 hosts' destinations."""
    root = make_checkout(tmp_path / "checkout", fleet, fleet.ssh_config_path, roles={}, **BOUNDS)
    destinations = [line for line in fleet.env_lines(ROLES) if not line.startswith("NARWHAL_SSH_CONFIG=")]
    with (root / ".env").open("a", encoding="utf-8") as env:
        env.write("\n".join(destinations) + "\n")
    return root


def fill(filesystem: Path) -> None:
    """Write zeros until the filesystem has no space left."""
    subprocess.run(["dd", "if=/dev/zero", f"of={filesystem / 'filler'}", "bs=64k"], capture_output=True, check=False)


def test_one_discovery_survives_a_killed_sshd_a_cut_link_a_new_host_key_and_a_full_disk(
    checkout: Path, fleet: SimFleet, tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "dagster-home", "16m") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")} | {"DAGSTER_HOME": str(home)}
        command = [sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "discover"]
        first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert first.returncode == 0, first.stderr
        before = snapshot(checkout / "config")
        runs_before = set(run_dirs(checkout))

        def cut_and_fill() -> None:
            fill(home)
            fleet.cut_link(CUT)

        fleet.kill_sshd(KILLED)
        fleet.rotate_host_key(REKEYED)
        started_marker(fleet, CUT).unlink(missing_ok=True)
        try:
            with host_tool(fleet, CUT, "nvidia-smi", STALL):
                breaker = when_started([CUT], fleet, cut_and_fill)
                began = time.monotonic()
                drill = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
                wall = time.monotonic() - began
                breaker.join()
        finally:
            fleet.restore_link(CUT)
            fleet.start_host(KILLED)
            started_marker(fleet, CUT).unlink(missing_ok=True)

    err = drill.stderr
    assert drill.returncode == 1, drill.stdout + err
    assert "Traceback" not in drill.stdout + err, err
    assert all(line.startswith("deploy-hosts discover: error: ") for line in err.splitlines()), err
    # every fault, named with what ended it
    assert f"host {host_id(KILLED)} ({fleet.host(KILLED).address}:22): cannot connect: connection refused" in err
    assert f"host {host_id(CUT)} ({fleet.host(CUT).address}:22): {KEEPALIVE_LOST}" in err
    assert f"host {host_id(REKEYED)} ({fleet.host(REKEYED).address}:22)" in err and "HOST KEY CHANGED" in err
    # the full disk: recording the failed run in Dagster's storage failed, which loses none of the above
    assert re.search(r"discovery_job stopped: OperationalError: .*(disk I/O error|disk is full).*; nothing was "
                     r"published$", err.splitlines()[-1]), err  # fmt: skip
    assert not [name for name in HEALTHY if f"host {host_id(name)} " in err], err
    # the healthy hosts' results were kept in this run's directory; the previous config set is untouched
    [run] = set(run_dirs(checkout)) - runs_before
    for name in HEALTHY:
        assert read_json(run / f"{host_id(name)}.json")["gpus"], name
    assert not (run / "manifest.json").exists()
    assert snapshot(checkout / "config") == before
    # no host reached the host timeout: the whole run ends within it (plus start-up), not the probe timeout
    assert wall < HOST_TIMEOUT_S + STARTUP_ALLOWANCE_S, wall

"""The fault drill on the install path: one `deploy-hosts install` onto 5 hosts while one host dies during
venv creation, another's disk fills during the clone, a third's link is cut mid-install, and then the command
itself is SIGKILLed. Afterwards every host is complete and verified or has no marker, nothing of the command
runs on the workstation or on a host, and the rerun, once the faults are undone, completes and activates all.

Each fault is placed where it bites, at the moment the run reaches it (polled, never slept for):
- h1 (router) stages completely: marker written, `current` not moved, since the
  default `--activate all` waits for every host;
- h2 is killed (its sshd, sessions and every process of its user) while `python -m venv` runs ensurepip: a
  half-made `.venv` (bin/python, no pip, no bin/activate) that the rerun must rebuild;
- h3's home is a small filesystem, which its `git` (a wrapper in /usr/local/bin) fills as the clone begins:
  the clone fails with ENOSPC at gate 'checkout';
- h4's link is cut while its install command runs: keep-alives end the connection within 6 s. The host
  cannot learn of the loss while the link is down (its sshd sends nothing), so it is checked once the link
  is back: the closed connection then reaches its sshd and the guard stops the installer;
- h5's install command is still running when the command is SIGKILLed: its channel closing stops it.
All files are received before any fault, so the rerun sends nothing: it completes what each host lacks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli, discover, prepare
from helpers.faults import host_processes, host_tool, live_processes, none_left, small_filesystem, user_processes
from helpers.fleet_checkout import MODEL, MODEL_CONFIG, WEIGHTS, make_checkout
from helpers.git_repo import git_checkout
from helpers.install import OFFLINE_CHECK, OFFLINE_INSTALL, SLOW_FLAG, STARTED_FLAG, manifest_of

from narwhal_assets.core.inputs.envfile import shell_quote

pytestmark = pytest.mark.fleet
HOSTS = [f"h{n}" for n in range(1, 6)]
ROLES = {"router": "h1", **{f"engine-{n}": f"h{n}" for n in range(1, 6)}}
STAGED, KILLED, FULL, CUT, IN_FLIGHT = HOSTS
ALIVE = {"NARWHAL_SSH_ALIVE_INTERVAL": "2", "NARWHAL_SSH_ALIVE_COUNT": "3"}  # a loaded machine answers in time
KEEPALIVE_LOST = "connection lost: no reply to keep-alive within 6 s (2 s x 3)"
DISK = "48m"  # FULL's home: the install (a venv with pip) fits, until the filler takes the rest
# On a host whose home holds SLOW_FLAG the install command announces itself, then outlasts the drill.
STALLING_INSTALL = (f'if [ -e "$HOME/{SLOW_FLAG}" ]; then touch "$HOME/{STARTED_FLAG}"; sleep 3601; fi; '
                    f"{OFFLINE_INSTALL}")  # fmt: skip
# The installer runs git with HOME=/dev/null: the account's home (the small filesystem) comes from passwd.
FILL_THEN_GIT = """#!/bin/sh
if [ "$1" = clone ]; then
    dd if=/dev/zero of="$(getent passwd "$(id -un)" | cut -d: -f6)/filler" bs=64k 2>/dev/null
fi
exec /usr/bin/git "$@"
"""
DRILL_LIMIT_S = 600  # a liveness bound for the drill's run to reach every fault (not a speed check)


def host_id(name: str) -> str:
    return f"node-{name[1:]}"  # each host holds the engine of its number (h1 also the router)


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet]) -> Iterator[SimFleet]:
    """Five hosts; FULL's home is a small filesystem, mounted before its sshd starts (which binds the home)."""
    fleet = sim_fleet_factory()
    for name in HOSTS:
        fleet.add_host(name)
    with small_filesystem(fleet.host(FULL).home, DISK):
        fleet.start()
        fleet.write_model(MODEL, WEIGHTS, MODEL_CONFIG)
        yield fleet


@pytest.fixture
def root(tmp_path: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]) -> Path:
    """A discovered git checkout of the 5 hosts, with the offline (stalling) install and check commands."""
    root = make_checkout(tmp_path / "checkout", fleet, fleet.ssh_config_path, roles={}, **ALIVE)
    destinations = [line for line in fleet.env_lines(ROLES) if not line.startswith("NARWHAL_SSH_CONFIG=")]
    revision = git_checkout(root)
    with (root / ".env").open("a", encoding="utf-8") as env:
        env.write("\n".join(destinations) + "\n")
    discover(root, capsys)
    settings = {"NARWHAL_DEPLOYMENT_REVISION": revision, "NARWHAL_REMOTE_INSTALL": STALLING_INSTALL,
                "NARWHAL_REMOTE_CHECK": OFFLINE_CHECK}  # fmt: skip
    with (root / ".env").open("a", encoding="utf-8") as env:
        env.writelines(f"{name}={shell_quote(value)}\n" for name, value in settings.items())
    return root


def host_log(run: Path, name: str) -> str:
    path = run / "logs" / f"{host_id(name)}.log"
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def line(out: str, name: str) -> str:
    found = re.search(rf"^  {host_id(name)}\s+roles=\S+\s+(.*)$", out, re.M)
    assert found, out
    return found.group(1)


def current(fleet: SimFleet, name: str) -> str | None:
    link = fleet.host(name).home / "Narwhal-deploy" / "current"
    return os.readlink(link) if link.is_symlink() else None


def status(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    """`deploy-hosts status --json`, which must find nothing wrong: host id -> its entry."""
    rc, out, err = cli(root, "status", "--json", capsys=capsys)
    assert rc == 0, out + err
    return {host["host"]: host for host in json.loads(out)["hosts"]}


def drive(faults: dict[str, tuple[Callable[[], object], Callable[[], None]]], reached: dict[str, Callable[[], bool]],
          command: subprocess.Popen[bytes]) -> None:  # fmt: skip
    """Poll the running command: break each host as soon as its moment (the first callable) comes, and return
    once every host has reached where it is to be when the command is killed."""
    pending = dict(faults)
    deadline = time.monotonic() + DRILL_LIMIT_S
    while pending or not all(check() for check in reached.values()):
        for name, (moment, fault) in list(pending.items()):
            if moment():
                fault()
                del pending[name]
        assert command.poll() is None, "the install ended before the drill was complete"
        waiting = sorted(pending) + [name for name, check in reached.items() if not check()]
        assert time.monotonic() < deadline, f"gave up waiting for {waiting}"
        time.sleep(0.05)


def test_an_install_through_a_killed_host_a_full_disk_a_cut_link_and_a_sigkill_ends_clean_and_reruns_complete(
    root: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = prepare(root, capsys)
    manifest = manifest_of(run)
    deployment = manifest.deployment_id
    dirs = {name: fleet.host(name).home / manifest.remote_dir for name in HOSTS}
    started = {name: fleet.host(name).home / STARTED_FLAG for name in (CUT, IN_FLIGHT)}
    slow = [fleet.host(name).home / SLOW_FLAG for name in (CUT, IN_FLIGHT)]
    filler = fleet.host(FULL).home / "filler"
    venv = dirs[KILLED] / "checkout" / ".venv"
    for flag in slow:
        flag.touch()
    faults = {KILLED: (partial(host_processes, fleet, KILLED, "ensurepip"), partial(fleet.kill_sshd, KILLED)),
              CUT: (started[CUT].exists, partial(fleet.cut_link, CUT))}  # fmt: skip
    reached = {STAGED: (dirs[STAGED] / "installed").exists,
               KILLED: lambda: "connection failure: " in host_log(run, KILLED),
               FULL: lambda: "--- gate checkout: " in host_log(run, FULL),
               CUT: lambda: KEEPALIVE_LOST in host_log(run, CUT),
               IN_FLIGHT: started[IN_FLIGHT].exists}  # fmt: skip
    try:
        with host_tool(fleet, FULL, "git", FILL_THEN_GIT):
            command = subprocess.Popen([sys.executable, "-m", "narwhal_assets", "--root", str(root), "install",
                                        "--run", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)  # fmt: skip
            try:
                drive(faults, reached, command)
                os.killpg(command.pid, signal.SIGKILL)
            finally:
                if command.poll() is None:
                    os.killpg(command.pid, signal.SIGKILL)
                _, err = command.communicate(timeout=60)
        assert command.returncode == -signal.SIGKILL, err.decode()
        # nothing of the command is left on the workstation (in its session, or naming its checkout after
        # leaving it), nor on a host it could still reach
        assert none_left(lambda: live_processes(session=command.pid) + live_processes(needle=str(root))) == []
        for name in (STAGED, KILLED, FULL, IN_FLIGHT):
            assert none_left(partial(user_processes, fleet, name)) == [], f"{name} still runs what the drill started"

        # each fault was met where it was placed, and stopped its host without a marker
        assert "connection closed by the host before host program `installer.py` finished" in host_log(run, KILLED)
        assert "No space left on device" in host_log(run, FULL) and filler.stat().st_size > 0
        assert {name: (d / "installed").exists() for name, d in dirs.items()} == {n: n == STAGED for n in HOSTS}
        assert (dirs[STAGED] / "installed").read_text() == manifest.revision + "\n"
        assert {name: current(fleet, name) for name in HOSTS} == dict.fromkeys(HOSTS), "no host was activated"
        assert (venv / "pyvenv.cfg").is_file() and not (venv / "bin" / "activate").exists(), "killed mid-venv"
        assert sorted(p.name for p in dirs[FULL].iterdir() if p.name.startswith("checkout")) == [], "half a clone"

        fleet.restore_link(CUT)  # now the closed connection can reach CUT, whose guard stops the installer
        assert none_left(partial(user_processes, fleet, CUT)) == [], f"{CUT} still runs what the drill started"
    finally:
        fleet.restore_link(CUT)
        fleet.start_host(KILLED)
        filler.unlink(missing_ok=True)
        for flag in [*slow, *started.values()]:
            flag.unlink(missing_ok=True)

    # the hosts agree: STAGED is complete and verifies; the others hold the directory without a marker
    before = status(root, capsys)
    for name in HOSTS:
        [entry] = before[host_id(name)]["deployments"]
        expected = ("installed", "intact") if name == STAGED else ("incomplete", "unknown")
        assert (entry["name"], entry["state"], entry["check"]) == (deployment, *expected), (name, entry)
        assert before[host_id(name)]["current"] is None

    rc, out, err = cli(root, "install", "--run", str(run), capsys=capsys)
    assert rc == 0, out + err
    assert "took over the stale lease of" in out, out
    assert line(out, STAGED).startswith("reused, activated (was none) (0 files, 0 bytes sent"), out
    for name in (KILLED, FULL, CUT, IN_FLIGHT):
        assert line(out, name).startswith("installed, activated (was none) (0 files, 0 bytes sent"), out
    assert {name: current(fleet, name) for name in HOSTS} == dict.fromkeys(HOSTS, deployment)
    assert (venv / "bin" / "activate").is_file(), "the half-made venv was rebuilt"
    after = status(root, capsys)
    for name in HOSTS:
        [entry] = after[host_id(name)]["deployments"]
        assert (entry["name"], entry["state"], entry["check"]) == (deployment, "installed", "intact"), (name, entry)
        assert after[host_id(name)]["current"] == deployment

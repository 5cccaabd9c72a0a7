"""What the host installer trusts, never follows and never runs (docs/install.md), tested by running the real
installer locally as a host would (the guard running the framed program, its own HOME, real git, real files):
half-made virtualenvs, racing lock takeovers, lock code killed at each step, symlinks and FIFOs where the
installer reads or writes, hostile git configuration, a full disk and a hanging command; plus the workstation
rules beside it (gates, escaping, private prepared runs, drift while an install runs)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from helpers.host_program import run_host_program
from helpers.installer_host import DEPLOYMENT, QUICK_S, REMOTE_DIR, Host, installed_home

from narwhal_assets.core import display
from narwhal_assets.core.discovery import drift
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.defs.installation.status import record_statuses
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
from narwhal_assets.host import installer, program_stream
from narwhal_assets.local.privatefiles import non_private
from narwhal_assets.protocols.install import (
    DeploymentEntry,
    Gate,
    installer_script,
    installer_source,
    parse_install_report,
    terminal_safe,
)
from narwhal_assets.ssh.access import make_connector
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.install import open_prepared_run
from narwhal_assets.workflows.status import HostStatus, host_status

OTHER = "fedcba9876543210fedcba9876543210"


def _shipped_installer() -> Path:
    """The installer program exactly as a host runs it (its source, then the lease's), as one file: the lock
    tests run its code directly, and the installer uses the lease's helpers."""
    program = installer_source()
    path = Path(tempfile.gettempdir()) / f"narwhal-installer-{hashlib.sha256(program.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        path.write_text(program)
    return path


INSTALLER = _shipped_installer()


@pytest.fixture
def done(installed_homes: Path, tmp_path: Path) -> Host:
    """A copy of one complete installation, which the tests damage."""
    return Host(*installed_home(installed_homes, tmp_path / "copy" / "home"))


def pip_importable(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-I", "-c", "import pip"], check=False).returncode == 0


# --------------------------------------------------------------------------------------------- 1. venv


VENV_DAMAGES = {  # each way `python -m venv` can be cut short (killed, out of disk)
    "no activate": lambda venv: (venv / "bin" / "activate").unlink(),
    "no pip": lambda venv: shutil.rmtree(next((venv / "lib").glob("python*/site-packages")) / "pip"),
    "no pyvenv.cfg": lambda venv: (venv / "pyvenv.cfg").unlink(),
}


@pytest.mark.parametrize("what", VENV_DAMAGES)
def test_a_half_made_venv_is_rebuilt_and_never_marked(done: Host, what: str) -> None:
    """Rule: a step's result is verified before it is trusted; the marker is written only over a complete
    installation. Each way `python -m venv` can be cut short is rebuilt by the rerun."""
    venv = done.checkout / ".venv"
    VENV_DAMAGES[what](venv)
    inspected = done.call("inspect")
    assert inspected.outcome == "incomplete", what  # not `reused`: a rerun must repair it
    assert done.stage().outcome == "staged", what
    assert (venv / "bin" / "activate").is_file() and (venv / "pyvenv.cfg").is_file(), what
    assert pip_importable(venv), what
    assert done.call("activate").outcome == "activated", what


def test_activate_refuses_a_venv_broken_after_it_was_marked(done: Host) -> None:
    """Activate refuses to point `current` at a deployment whose venv broke after its marker was written."""
    venv = done.checkout / ".venv"
    (venv / "bin" / "activate").unlink()
    refused = done.call("activate")
    assert (refused.outcome, refused.gate) == ("failed", "venv")
    assert refused.message == "checkout/.venv is incomplete (no bin/activate): run the install again"
    assert os.path.exists(venv / "bin" / "python")


def test_a_venv_killed_mid_creation_is_not_reused(unmarked: Host) -> None:
    """A `.venv` whose bin/python exists but without pip or activate (what `python -m venv` leaves when killed
    while it installs pip) is rebuilt, not trusted."""
    assert unmarked.call("install", send=list(unmarked.payloads), check_command="false").gate == "check"
    venv = unmarked.checkout / ".venv"
    shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    for script in (venv / "bin").glob("activate*"):
        script.unlink()
    assert unmarked.install().outcome == "activated"
    assert (venv / "bin" / "activate").is_file() and pip_importable(venv)


# --------------------------------------------------------------------------------------------- 3. lock

# Two racers per round, forked from one process that compiled the installer once (a round costs two forks, not
# two interpreters): each runs the installer's own lock code, both released together.
RACERS = """
import json, os, sys, time
sys.path.insert(0, "")
namespace = {"__name__": "installer"}
exec(compile(open(sys.argv[1]).read(), "installer", "exec"), namespace)


def race(start):
    one = namespace["Installer"]({"remote_dir": sys.argv[2], "owner": "racer %d" % os.getpid()})
    os.read(start, 1)  # both racers start together
    try:
        one.lock()
    except namespace["GateFailure"] as failure:
        return {"held": False, "why": failure.message}
    lock = os.path.join(one.base, ".install-lock")
    try:
        os.mkdir(os.path.join(one.base, "inside"))  # fails when the other racer holds it too
        alone = True
    except FileExistsError:
        alone = False
    time.sleep(0.02)
    still_mine = (namespace["_read_owner"](lock) or {}).get("pid") == os.getpid()
    if alone:
        os.rmdir(os.path.join(one.base, "inside"))
    one.unlock()
    return {"held": True, "alone": alone, "still_mine": still_mine}


for _ in sys.stdin:  # a line per round: its two racers' results as one JSON line
    start, go = os.pipe()
    racers = []
    for _ in range(2):
        answer, answering = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go)
            os.close(answer)
            os.write(answering, json.dumps(race(start)).encode())
            os._exit(0)
        os.close(answering)
        racers.append((pid, answer))
    os.close(start)
    os.write(go, b"..")
    os.close(go)
    results = []
    for pid, answer in racers:
        with os.fdopen(answer, "rb") as said:
            results.append(json.loads(said.read() or b"null"))
        os.waitpid(pid, 0)
    print(json.dumps(results), flush=True)
"""

# The installer's own lock code, killed (SIGKILL) at one point: before its n-th `_write_new` ("write"), or
# before or after its n-th `os.rename` ("before", "after"), while it takes and then releases the lock.
KILLED = """
import os, signal, sys
namespace = {"__name__": "installer"}
exec(compile(open(sys.argv[1]).read(), "installer", "exec"), namespace)
when, n = sys.argv[3], int(sys.argv[4])
calls = {"write": 0, "rename": 0}
write, rename = namespace["_write_new"], os.rename

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def killing_write(*args):
    calls["write"] += 1
    if when == "write" and calls["write"] == n:
        die()
    return write(*args)

def killing_rename(*args):
    calls["rename"] += 1
    if when == "before" and calls["rename"] == n:
        die()
    rename(*args)
    if when == "after" and calls["rename"] == n:
        die()

namespace["_write_new"], os.rename = killing_write, killing_rename
one = namespace["Installer"]({"remote_dir": sys.argv[2], "owner": "killed"})
one.lock()
one.unlock()
"""

HOLDER = """
import os, sys
namespace = {"__name__": "installer"}
exec(compile(open(sys.argv[1]).read(), "installer", "exec"), namespace)
one = namespace["Installer"]({"remote_dir": sys.argv[2], "owner": "holder"})
one.lock()
print("held", flush=True)
sys.stdin.readline()
one.unlock()
"""


def stale_lock(base: Path) -> None:
    """A lock whose owner (a process that ran and exited) is gone, as a killed host session leaves it."""
    (base / ".install-lock").mkdir(parents=True)
    (base / ".install-lock" / "owner.json").write_text(json.dumps(dead_owner()))


def dead_owner() -> dict[str, object]:
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return {"pid": int(gone.stdout), "start": "1", "boot": boot, "since": "2026-01-01T00:00:00Z", "by": "dead",
            "token": "0" * 32}  # fmt: skip


def ownerless_lock(base: Path, age_s: float, partial: bool = False) -> Path:
    """`.install-lock` without an owner record, unchanged for `age_s`: what an older installer left when killed
    (or out of disk) between its `mkdir` and writing `owner.json` (`partial`: while writing it)."""
    lock = base / ".install-lock"
    lock.mkdir(parents=True)
    if partial:
        (lock / ".owner.json.part").write_text('{"pid": 12')
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def lock_leftovers(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.name.startswith(".install-lock"))


def raw_call(host: Host, action: str, **extra: object) -> dict[str, Any]:
    """One installer run like `Host.call` (no file sent), as the raw report: with what the models drop."""
    script = installer_script({**host.params, "action": action, "send": [], **extra})
    env = {"HOME": str(host.home), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    done = run_host_program(program_stream(script, [b""]), env, QUICK_S * 4)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def deployment_state(host: Host) -> str:
    return host.status(**host.known())[DEPLOYMENT].state


def test_a_lock_left_without_its_owner_record_holds_only_until_it_is_stale(done: Host) -> None:
    """An older installer killed (or out of disk) between `mkdir .install-lock` and writing `owner.json` left a
    lock no one owns, which blocked every later install for good. It holds (and `status` calls the deployment
    locked) only while it could still be an installer making it: changed less than 600 s ago in this boot.
    Then the next install takes it over, saying so; `status` no longer calls it locked. A live installer's
    lock (made by renaming a complete lock directory into place) is `locked` for as long as it runs: a host
    with an install in progress is not drifting."""
    holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", HOLDER, str(INSTALLER), REMOTE_DIR],
                              env={"HOME": str(done.home), "PATH": "/usr/bin:/bin"}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "held\n"
        assert deployment_state(done) == "locked"
        since = json.loads((done.base / ".install-lock" / "owner.json").read_text())["since"]
        report = done.call("activate")
        assert report.gate == "lock"
        assert report.message == f".install-lock is held by holder (pid {holder.pid}) since {since}"
    finally:
        holder.communicate("done\n", timeout=QUICK_S)
    assert deployment_state(done) == "installed"
    assert lock_leftovers(done.base) == []

    for partial in (False, True):
        lock = ownerless_lock(done.base, 10, partial)
        report = raw_call(done, "activate")
        assert (report["outcome"], report["gate"]) == ("failed", "lock")
        assert report["message"] == ".install-lock is held by an unknown owner (no readable owner.json)"
        assert deployment_state(done) == "locked"
        assert lock.is_dir(), "a lock that still holds is never removed"

        old = time.time() - installer.OWNERLESS_STALE_S - 60
        os.utime(lock, (old, old))
        assert deployment_state(done) == "installed", "an ownerless stale lock is no install in progress"
        report = raw_call(done, "activate")
        assert report["outcome"] == "activated", report
        [note] = report["notes"]
        assert re.fullmatch(r"\.install-lock had no readable owner\.json (for \d+ s|since before this boot) \(an "
                            r"installer killed while making it\): taken over", note), note  # fmt: skip
        assert lock_leftovers(done.base) == []

    # unchanged since before this boot: no installer of this boot is making it, so it is stale at once
    lock = ownerless_lock(done.base, 0)
    before_boot = installer.boot_time() - 60
    os.utime(lock, (before_boot, before_boot))
    report = raw_call(done, "activate")
    assert report["outcome"] == "activated", report
    assert report["notes"] == [".install-lock had no readable owner.json since before this boot (an installer "
                               "killed while making it): taken over"]  # fmt: skip
    assert lock_leftovers(done.base) == []


def test_an_installer_killed_anywhere_in_its_lock_code_leaves_nothing_that_blocks(done: Host, tmp_path: Path) -> None:
    """Rule: every multi-file change is all-or-nothing under SIGKILL. The installer's own lock code, killed at
    each step of taking and releasing the lock: `status` never calls the deployment locked afterwards, the next
    install succeeds (taking over what is stale), and no lock directory is left behind. Lock directories under
    other names that hold more than regular files (a symlink, a directory, a FIFO) are left as they are, and nothing a
    symlink leads to is touched."""
    argv = [sys.executable, "-I", "-S", "-c", KILLED, str(INSTALLER), REMOTE_DIR]
    env = {"HOME": str(done.home), "PATH": "/usr/bin:/bin"}
    # before writing the owner record; before and after its rename into place; before and after the release
    # renames it away; and, from a stale lock, after renaming that away
    lock = ".install-lock"
    points = [("write", 1, f"{lock}.new"), ("before", 1, f"{lock}.new"), ("after", 1, lock), ("before", 2, lock),
              ("after", 2, f"{lock}.done"), ("stale", 1, f"{lock}.stale")]  # fmt: skip
    for when, n, left in points:
        if when == "stale":  # the dead owner's half-made file is removed all the same
            stale_lock(done.base)
            dead = json.loads((done.base / lock / "owner.json").read_text())["pid"]
            part = done.base / f".source.bundle.part-{dead}"
            part.write_text("half")
            when = "after"
        killed = subprocess.run([*argv, when, str(n)], env=env, capture_output=True, text=True, check=False)
        assert killed.returncode == -9, (when, n, killed.stderr)
        assert [re.sub(r"-[0-9a-f]{32}$", "", name) for name in lock_leftovers(done.base)] == [left], (when, n)
        assert deployment_state(done) == "installed", (when, n, lock_leftovers(done.base))
        report = raw_call(done, "activate")
        assert report["outcome"] == "activated", (when, n, report)
        assert lock_leftovers(done.base) == [], (when, n)
    assert not part.exists()

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "owner.json").write_text("keep\n")
    kept = {f".install-lock.new-{'1' * 32}": lambda p: (p / "owner.json").symlink_to(victim / "owner.json"),
            f".install-lock.done-{'2' * 32}": lambda p: (p / "sub").mkdir(),
            f".install-lock.stale-{'3' * 32}": lambda p: os.mkfifo(p / "owner.json")}  # fmt: skip
    for name, fill_in in kept.items():
        (done.base / name).mkdir()
        fill_in(done.base / name)
    (done.base / f".install-lock.new-{'4' * 32}").symlink_to(victim)
    removable = done.base / f".install-lock.new-{'5' * 32}"
    removable.mkdir()
    (removable / "owner.json").write_text(json.dumps(dead_owner()))
    report = raw_call(done, "activate")
    assert report["outcome"] == "activated", report
    assert report["notes"] == ["removed 1 lock directory left by killed installers"]
    assert lock_leftovers(done.base) == sorted([*kept, f".install-lock.new-{'4' * 32}"])
    assert (victim / "owner.json").read_text() == "keep\n" and sorted(os.listdir(victim)) == ["owner.json"]


def test_two_installers_racing_for_a_lock_never_both_hold_it(tmp_path: Path) -> None:
    """Rule: at most one installer per deployment directory at any moment. 200 rounds of two processes
    running the installer's own lock code at once: against a stale lock, against no lock (both making one),
    against an older installer's ownerless lock, and beside lock directories killed installers left: never
    two holders, a lock is never removed from under its holder by the other, and nothing is left behind."""
    home = tmp_path / "home"
    base = home / REMOTE_DIR
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    setups = {
        "stale lock": stale_lock,
        "no lock": lambda base: base.mkdir(parents=True, exist_ok=True),
        "ownerless lock": lambda base: ownerless_lock(base, installer.OWNERLESS_STALE_S + 60, partial=True),
        "killed installers' lock directories": lambda base: [
            (base / f".install-lock.{kind}-{os.urandom(16).hex()}").mkdir(parents=True) for kind in ("new", "done")],
    }  # fmt: skip
    holders = 0
    argv = [sys.executable, "-I", "-S", "-c", RACERS, str(INSTALLER), REMOTE_DIR]
    with subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as racers:
        assert racers.stdin is not None and racers.stdout is not None
        for round_ in range(200):
            what = list(setups)[round_ % len(setups)]
            setups[what](base)
            racers.stdin.write("go\n")
            racers.stdin.flush()
            assert select.select([racers.stdout], [], [], QUICK_S)[0], f"round {round_} ({what}): no answer"
            results = json.loads(racers.stdout.readline())
            held = [r for r in results if r["held"]]
            assert held, f"round {round_} ({what}): nobody took the lock: {results}"
            assert all(r["alone"] and r["still_mine"] for r in held), f"round {round_} ({what}): {results}"
            holders += len(held)
            assert not (base / ".install-lock").exists(), f"round {round_} ({what}): the holder left its lock"
            assert sorted(p.name for p in base.iterdir()) == [], f"round {round_} ({what}): leftovers"
        racers.stdin.close()
        assert racers.wait(timeout=QUICK_S) == 0
    assert holders >= 200


def test_an_installer_removes_only_a_lock_whose_owner_record_is_its_own(host: Host) -> None:
    """unlock() of an installer whose lock was replaced (taken over, or remade by hand) leaves it alone."""
    code = (f"exec(compile(open({str(INSTALLER)!r}).read(), 'installer', 'exec'))\n"
            f"one = Installer({{'remote_dir': {REMOTE_DIR!r}}})\none.lock()\n"
            "open(one.path('.install-lock', 'owner.json'), 'w').write('{\"pid\": 1, \"by\": \"someone else\"}')\n"
            "one.unlock()\n")  # fmt: skip
    host.base.mkdir(parents=True)
    subprocess.run([sys.executable, "-I", "-S", "-c", code], env={"HOME": str(host.home)}, check=True)
    assert json.loads((host.base / ".install-lock" / "owner.json").read_text())["by"] == "someone else"


# --------------------------------------------------------------------------------------------- 4. symlinks


def test_a_symlinked_deploy_directory_stops_every_action_and_changes_nothing(done: Host, tmp_path: Path) -> None:
    """Rule: every path is reached without following a symlink the installer did not make; a symlink where
    a directory belongs stops the host at a named gate, on every action, and nothing is written."""
    elsewhere = tmp_path / "elsewhere"
    done.top.rename(elsewhere)
    done.top.symlink_to(elsewhere)
    before = sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*"))
    for action, extra in [("inspect", {}), ("install", {"send": []}), ("activate", {}),
                          ("status", {"remote_base": "Narwhal-deploy"}),
                          ("prune", {"remote_base": "Narwhal-deploy", "remove": [DEPLOYMENT]})]:  # fmt: skip
        report = done.call(action, **extra)  # type: ignore[arg-type]
        assert (report.outcome, report.gate) == ("failed", "directory"), action
        assert report.message == "Narwhal-deploy is a symlink (left as it is)", action
        assert report.current is None, action
    assert sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")) == before


def test_a_symlinked_checkout_is_never_reused_and_cleanup_never_follows_links(done: Host, tmp_path: Path) -> None:
    real = tmp_path / "real-checkout"
    done.checkout.rename(real)
    done.checkout.symlink_to(real)
    inspected = done.call("inspect")
    assert (inspected.gate, inspected.message) == ("checkout", "checkout is a symlink (left as it is)")
    assert done.call("activate").gate == "checkout"
    assert done.status(**done.known())[DEPLOYMENT].check == "tampered"
    done.checkout.unlink()
    real.rename(done.checkout)

    # stale-lock cleanup deletes the dead owner's `*.part-<pid>` files, never what a symlink leads to
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.part-4242").write_text("mine\n")
    deployment = done.checkout / "runs" / "deployment"
    shutil.rmtree(deployment)
    deployment.symlink_to(victim)
    stale_lock(done.base)
    owner = json.loads((done.base / ".install-lock" / "owner.json").read_text())
    (done.base / ".install-lock" / "owner.json").write_text(json.dumps({**owner, "pid": 4242, "start": ""}))
    if Path("/proc/4242").exists():
        pytest.skip("pid 4242 runs here")
    report = done.call("install", send=[])
    assert (report.gate, report.message) == ("place file", "checkout/runs/deployment is a symlink (left as it is)")
    assert (victim / "keep.part-4242").read_text() == "mine\n"


# --------------------------------------------------------------------------------------------- 5. FIFOs


def test_a_fifo_where_a_host_file_is_read_never_blocks(done: Host) -> None:
    """Rule: every host file is opened only after checking it is a regular file (non-blocking, no follow,
    fstat), with a size bound: a FIFO answers at once at its gate."""
    (done.base / ".install-lock").mkdir()
    os.mkfifo(done.base / ".install-lock" / "owner.json")
    began = time.monotonic()
    report = done.call("install", send=[])
    assert (report.gate, report.message) == ("lock", ".install-lock is held by an unknown owner (no readable "
                                             "owner.json)")  # fmt: skip
    assert done.status(**done.known())[DEPLOYMENT].state == "locked"
    shutil.rmtree(done.base / ".install-lock")
    (done.base / ".installed-files").unlink()
    os.mkfifo(done.base / ".installed-files")
    entry = done.status(**done.known())[DEPLOYMENT]
    assert (entry.check, entry.problem) == ("tampered", ".installed-files is not a regular file (left as it is)")
    (done.base / "installed").unlink()
    os.mkfifo(done.base / "installed")
    report = done.call("inspect")
    assert (report.gate, report.message) == ("marker", "installed is not a regular file (left as it is)")
    assert time.monotonic() - began < QUICK_S


# --------------------------------------------------------------------------------------------- 7. git


def test_an_index_flag_that_hides_a_change_is_a_tamper(done: Host) -> None:
    """Rule: verification compares each tracked file's content with the revision's tree; assume-unchanged
    and skip-worktree hide changes from `git status`, so either flag is itself a tamper."""
    git = ["git", "-c", "safe.directory=*", "-C", str(done.checkout)]
    for flag in ("--assume-unchanged", "--skip-worktree"):
        subprocess.run([*git, "update-index", flag, "README"], check=True)
        (done.checkout / "README").write_text("changed\n")
        hidden = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, check=True)  # fmt: skip
        assert hidden.stdout == "", "git itself no longer sees the change"
        entry = done.status(**done.known())[DEPLOYMENT]
        assert entry.check == "tampered", flag
        assert entry.problem == ("checkout/README: marked assume-unchanged or skip-worktree in the index, which "
                                 "hides changes (left as it is)")  # fmt: skip
        assert done.call("inspect").gate == "checkout"
        subprocess.run([*git, "update-index", flag.replace("--", "--no-"), "README"], check=True)
        (done.checkout / "README").write_text("demo\n")
    assert done.status(**done.known())[DEPLOYMENT].check == "intact"


def test_a_head_other_than_the_detached_revision_is_resolved_by_git(done: Host) -> None:
    """`.git/HEAD` is read directly only when it holds the revision; a branch is resolved by git (at the revision
    it is still intact) and another commit is named in the gate's message."""
    git = ["git", "-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C",
           str(done.checkout)]  # fmt: skip
    subprocess.run([*git, "checkout", "-q", "-b", "serving"], check=True)
    assert (done.checkout / ".git" / "HEAD").read_text() == "ref: refs/heads/serving\n"
    report = done.call("inspect")
    assert report.outcome == "reused", report
    assert report.steps[0].argv[-3:] == ["rev-parse", "--verify", "HEAD"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "local"], check=True)
    moved = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    entry = done.status(**done.known())[DEPLOYMENT]
    assert (entry.check, entry.problem) == ("tampered", f"checkout: HEAD is {moved}, not the approved revision")


def test_git_on_the_host_runs_no_fsmonitor_and_no_hooks(host: Host) -> None:
    """Rule: git runs with no system or global config, no hooks, no fsmonitor: read-only `status` runs no
    program named in the checkout's .git/config, and clone runs no hook named in ~/.gitconfig."""
    ran = host.home / "ran"
    hook = host.home / "hooks" / "post-checkout"
    hook.parent.mkdir()
    hook.write_text(f"#!/bin/sh\necho hook >> {ran}\n")
    hook.chmod(0o700)
    (host.home / ".gitconfig").write_text(f"[core]\n\thooksPath = {hook.parent}\n")
    assert host.install().outcome == "activated"
    assert not ran.exists(), "a hook from ~/.gitconfig ran during clone"
    monitor = host.home / "fsmonitor"
    monitor.write_text(f"#!/bin/sh\necho fsmonitor >> {ran}\n")
    monitor.chmod(0o700)
    subprocess.run(["git", "-C", str(host.checkout), "config", "core.fsmonitor", str(monitor)], check=True)
    assert host.status(**host.known())[DEPLOYMENT].check == "intact"
    assert host.call("inspect").outcome == "reused"
    assert not ran.exists(), "core.fsmonitor from .git/config ran during a read-only action"


# --------------------------------------------------------------------------------------------- 12. small ones


def test_a_full_disk_names_the_file_being_written(host: Host) -> None:
    """A write that fails without a file name (ENOSPC, EFBIG) names the file it was writing."""
    report = host.call("install", send=["source.bundle"], limit_file_size=4096)
    assert (report.gate, report.message) == ("io", "source.bundle: File too large")


def test_a_hanging_install_command_fails_at_gate_install(done: Host) -> None:
    """A command that does not finish within the action's budget is stopped with everything it started and
    fails its own gate with its output, before the workstation's command timeout drops the connection."""
    began = time.monotonic()
    report = done.call("install", send=[], install_command="echo started; sleep 600 & sleep 600", budget_s=8)
    assert (report.outcome, report.gate) == ("failed", "install")
    assert re.fullmatch(r"/bin/sh -c echo started; sleep 600 & sleep 600 did not finish within \d s \(stopped it\)",
                        report.message or "")  # fmt: skip
    assert report.steps[-1].output.startswith("started\n")
    assert time.monotonic() - began < QUICK_S * 2
    assert not (done.base / ".install-lock").exists()


# --------------------------------------------------------------------------------------------- gates, escaping


def _installer_gates() -> set[str]:
    """Every gate string installer.py can raise: the argument bound to a parameter named `gate` (of
    GateFailure or any function of the installer), a `gate=` keyword, and the tuple a `gate` loop runs over."""
    tree = ast.parse(INSTALLER.read_text())
    params = {node.name: [a.arg for a in node.args.args if a.arg != "self"]
              for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}  # fmt: skip
    params["GateFailure"] = ["gate", "message"]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            names = params.get(name, [])
            for index, arg in enumerate(node.args):
                if index < len(names) and names[index] == "gate" and isinstance(arg, ast.Constant):
                    found.add(arg.value)
            found |= {k.value.value for k in node.keywords
                      if k.arg == "gate" and isinstance(k.value, ast.Constant)}  # fmt: skip
        if isinstance(node, ast.For) and getattr(node.target, "id", "") == "gate" and isinstance(node.iter, ast.Tuple):
            found |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
    return found


def test_every_gate_the_installer_can_raise_is_a_member_of_gate() -> None:
    gates = _installer_gates()
    assert {"lock", "verify file", "install", "check", "io", "interrupted", "directory"} <= gates
    assert gates <= {g.value for g in Gate}, gates - {g.value for g in Gate}
    raw = {"schema": "narwhal.install-report", "schema_version": 1, "action": "inspect", "outcome": "failed",
           "gate": "made up", "message": "x"}  # fmt: skip
    with pytest.raises(Exception, match="not an install report"):
        parse_install_report(json.dumps(raw).encode())


def test_terminal_escaping_has_one_implementation() -> None:
    """core.display.printable escapes and bounds host text; the report models and drift use it."""
    assert drift.printable is display.printable
    hostile = "\x1b]0;pwned\x07\u202e" + "x" * 5000
    assert terminal_safe(hostile) == display.printable(hostile, 4096)
    assert drift.compare_host.__globals__["printable"] is display.printable
    raw = {"schema": "narwhal.install-report", "schema_version": 1, "action": "inspect", "outcome": "failed",
           "gate": "lock", "message": "held \u202eby\u00a0x"}  # fmt: skip
    assert parse_install_report(json.dumps(raw).encode()).message == display.printable(raw["message"], 4096)


# --------------------------------------------------------------------------------------------- 9. prepared run


def test_a_prepared_run_others_can_write_or_do_not_own_is_refused_before_any_contact(tmp_path: Path) -> None:
    """Rule: one privacy rule (owned by the operator, no group or other bit) for every private tree; a
    prepared run that breaks it is refused as bad input, naming each path, before its manifest is read."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    run = tmp_path / "run"
    (run / "node-1").mkdir(parents=True)
    (run / "revision").write_text("a" * 40)
    (run / "node-1" / ".env.engine-1").write_text("x")
    os.chmod(run, 0o777)
    os.chmod(run / "node-1", 0o700)
    os.chmod(run / "revision", 0o666)
    os.chmod(run / "node-1" / ".env.engine-1", 0o600)
    os.chown(run / "node-1" / ".env.engine-1", 4321, 4321)
    settings, inventory = Settings.load(tmp_path), Inventory(hosts=[])
    with pytest.raises(InputError) as refused:
        open_prepared_run(settings, inventory, run)
    assert refused.value.problems == [
        f"{run}: mode 0777, expected 0700; prepare a new run",
        f"{run / 'revision'}: mode 0666, expected 0600; prepare a new run",
        f"{run / 'node-1' / '.env.engine-1'}: owned by uid 4321, not by this user (uid {os.getuid()}); "
        "prepare a new run",
    ]
    assert non_private([run]) == [p.removesuffix("; prepare a new run") for p in refused.value.problems]


# --------------------------------------------------------------------------------------------- 6. drift


def test_status_overlapping_a_commit_is_not_drift(tmp_path: Path) -> None:
    """Rule: drift means `current` moved outside the tool. A host seen with an install in progress, or one
    whose install was recorded after status began reading it, is not drifting."""
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["node-1", "node-2", "node-3"])

        def installed(host_id: str, deployment: str) -> None:
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=INSTALLATION, partition=host_id, metadata={"deployment_id": deployment,
                                                                      "revision": "r" + deployment[:3]}))  # fmt: skip

        def seen(host_id: str, current: str, state: str = "installed") -> HostStatus:
            return HostStatus(host_id, ["engine"], current=current, deployments=[
                DeploymentEntry(name=current, state="installed", revision="r" + current[:3], check="intact"),
                DeploymentEntry(name=OTHER if current == DEPLOYMENT else DEPLOYMENT, state=state)])  # fmt: skip

        for host_id in ("node-1", "node-2", "node-3"):
            installed(host_id, DEPLOYMENT)
        reads = [seen("node-1", DEPLOYMENT), seen("node-2", DEPLOYMENT, state="locked"), seen("node-3", OTHER)]
        installed("node-1", OTHER)  # an install committed while status was reading node-1: current moved since
        installed("node-2", OTHER)
        drifted, _, evaluation = record_statuses(instance, reads)
        assert drifted == ["node-3"], "only node-3's current moved outside the tool"
        assert not evaluation.passed
        drifted, _, _ = record_statuses(instance, [seen("node-1", OTHER), seen("node-2", DEPLOYMENT)])
        assert drifted == ["node-2", "node-3"]


# --------------------------------------------------------------------------------------------- 12. status lines


def test_status_names_an_unreachable_host_once(tmp_path: Path) -> None:
    """`status` problem lines are `host <id>: <why>`: the connection's message already names the host, so
    the line must not say it twice (it said `host node-4: host node-4 (...): ...`)."""
    (tmp_path / ".env").write_text("NARWHAL_ENGINE_1_SSH=t@gpu-box.invalid\n")  # .invalid never resolves
    settings = Settings.load(tmp_path)
    entry = HostEntry(id="node-4", ssh_env="NARWHAL_ENGINE_1_SSH", roles=["engine-1"])
    found = host_status(make_connector(settings, TrustMode.STRICT, 5, 5), settings, entry, [])
    assert found.error == "(gpu-box.invalid:22): cannot connect: name or service not known"
    assert found.problems() == [f"host node-4: {found.error}"]

"""The host-side installer run locally as a host would run it: the guard and the framed program on stdin, with its
own HOME, real git and real files. Gates, the lock and the reuse path, without SSH (the fleet tests add it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.installer_host import REMOTE_DIR, ROLE_FILE, Host, installed_home, link_copy
from helpers.procfs import proc_fields

from narwhal_assets.core.errors import ReportError
from narwhal_assets.host.installer import files_sha256
from narwhal_assets.protocols.install import parse_install_report


def test_install_activate_then_reuse_receives_nothing(host: Host) -> None:
    assert host.call("inspect").outcome == "absent"
    report = host.install()
    assert (report.outcome, report.files_verified) == ("activated", 3)
    assert (host.base / "installed").read_text() == host.params["revision"] + "\n"
    assert (host.base / "checkout" / "runs" / "deployment" / ".env.engine-1").read_bytes() == ROLE_FILE
    assert not (host.base / ".install-lock").exists()
    assert oct((host.base / "checkout" / "runs" / "deployment").stat().st_mode & 0o777) == "0o700"
    again = host.call("inspect")
    assert (again.outcome, again.bytes_received, again.files_verified) == ("reused", 0, 3)
    # reuse runs read-only git only: the revision's tree and the index (HEAD is read from .git/HEAD, content is
    # hashed by the installer)
    assert [step.argv[-3:] for step in again.steps] == [["-z", "--full-tree", host.params["revision"]],
                                                        ["-s", "-v", "-z"]]  # fmt: skip


def stat_of(pid: int) -> list[str]:
    fields = proc_fields(pid)
    assert fields is not None, f"process {pid} is gone"
    return fields


def lock_held_by(host: Host, pid: int) -> Path:
    """`.install-lock` with the owner record an installer running as `pid` would have written."""
    lock = host.base / ".install-lock"
    lock.mkdir(parents=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    owner = {"pid": pid, "start": stat_of(pid)[19], "boot": boot, "since": "2026-12-01T00:00:00Z", "by": "ci job 7"}
    (lock / "owner.json").write_text(json.dumps(owner))
    return lock


def test_a_held_lock_names_its_owner_and_a_dead_owners_lock_is_taken_over(unmarked: Host) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lock = lock_held_by(unmarked, sleeper.pid)
        report = unmarked.call("install", send=[])
        assert (report.outcome, report.gate) == ("failed", "lock")
        assert report.message == f".install-lock is held by ci job 7 (pid {sleeper.pid}) since 2026-12-01T00:00:00Z"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert lock.is_dir(), "a held lock is never removed by the host that found it"
    assert unmarked.install().outcome == "activated", "the owner process is gone: its lock is stale"


def test_a_lock_whose_owner_is_a_zombie_is_stale(unmarked: Host) -> None:
    """A killed installer whose parent (the sshd session, killed with it) is not reaped yet stays a zombie with
    its pid and start time in /proc for a while: it has exited, so `status` and the next install treat its
    lock as stale."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        lock_held_by(unmarked, sleeper.pid)
        sleeper.kill()
        while stat_of(sleeper.pid)[0] != "Z":  # killed, not reaped: this test is its parent
            time.sleep(0.01)
        assert unmarked.call("status", remote_base="Narwhal-deploy").deployments[0].state == "incomplete"
        assert unmarked.install().outcome == "activated"
    finally:
        sleeper.wait()


def test_a_lock_without_owner_information_holds(host: Host) -> None:
    (host.base / ".install-lock").mkdir(parents=True)
    report = host.call("install", send=[])
    assert report.gate == "lock"
    assert report.message == ".install-lock is held by an unknown owner (no readable owner.json)"


def test_a_cut_or_wrong_stream_fails_the_transfer_and_leaves_nothing_behind(host: Host) -> None:
    short = host.call("install", send=["source.bundle"], stream=host.payloads["source.bundle"][:-10])
    assert (short.gate, short.message) == ("transfer", "source.bundle: the stream ended 10 bytes early")
    wrong = host.call("install", send=[".env.engine-1"], stream=ROLE_FILE.replace(b"8001", b"9001"))
    assert wrong.gate == "transfer"
    assert wrong.message == ".env.engine-1: received content does not match the manifest hash"
    assert sorted(p.name for p in host.base.iterdir()) == [], "no temporary file, no lock"


def test_a_symlink_or_different_file_stops_at_verify_file_and_stays(host: Host) -> None:
    host.base.mkdir(parents=True)
    (host.base / "source.bundle").symlink_to("/etc/hostname")
    report = host.call("inspect")
    assert (report.gate, report.message) == ("verify file", "source.bundle is a symlink (left as it is)")
    assert host.call("install", send=[]).gate == "verify file"
    assert (host.base / "source.bundle").is_symlink()
    (host.base / "source.bundle").unlink()
    (host.base / ".env.engine-1").write_bytes(b"export OTHER=1\n")
    assert host.call("inspect").message == ".env.engine-1: content differs from the manifest (left as it is)"
    assert (host.base / ".env.engine-1").read_bytes() == b"export OTHER=1\n"


def test_after_install_a_changed_checkout_or_marker_is_a_named_gate(installed_homes: Path, tmp_path: Path) -> None:
    host = Host(*installed_home(installed_homes, tmp_path / "home"))
    readme = host.base / "checkout" / "README"
    readme.write_text("changed\n")
    report = host.call("inspect")
    assert (report.gate, report.message) == ("checkout", "checkout: tracked files differ from the revision "
                                             "(left as they are)")  # fmt: skip
    readme.write_text("demo\n")
    (host.base / "installed").write_text("f" * 40 + "\n")
    assert host.call("inspect").gate == "marker"


def test_a_failing_check_command_leaves_no_marker(unmarked: Host) -> None:
    unmarked.params["check_command"] = "echo broken >&2; exit 3"
    inspected = unmarked.call("inspect")
    report = unmarked.call("install", send=[n for n in unmarked.payloads if inspected.files.get(n) != "present"])
    assert (report.outcome, report.gate) == ("failed", "check")
    assert report.message == "/bin/sh -c echo broken >&2; exit 3 exited 3"
    assert report.steps[-1].output == "broken\n"
    assert not (unmarked.base / "installed").exists() and not (unmarked.base / ".install-lock").exists()


def test_reports_from_a_hostile_host_are_bounded_and_escaped() -> None:
    with pytest.raises(ReportError, match="printed no report"):
        parse_install_report(b"\n\n")
    with pytest.raises(ReportError, match="not JSON"):
        parse_install_report(b"garbage\x1b[2J")
    with pytest.raises(ReportError, match="not an install report"):
        parse_install_report(b'{"schema": "narwhal.install-report"}')
    raw = {"schema": "narwhal.install-report", "schema_version": 1, "action": "inspect", "outcome": "failed",
           "gate": "lock", "message": "held by \x1b]0;pwned\x07 x\ny"}  # fmt: skip
    report = parse_install_report(json.dumps(raw).encode())
    assert report.message == "held by \\x1b]0;pwned\\x07 x\\ny"
    with pytest.raises(ReportError, match="exceeds"):
        parse_install_report(b"x" * (9 << 20))


OTHER_DIR = "Narwhal-deploy/fedcba9876543210fedcba9876543210"


def known(*hosts: Host) -> dict[str, object]:
    return {h.base.name: {"revision": h.params["revision"], "files": h.params["files"]} for h in hosts}


def unmarked_pair(installed_homes: Path, home: Path) -> tuple[Host, Host]:
    """Two deployments of one source in one home (REMOTE_DIR, OTHER_DIR), each stopped just before its marker."""
    home, revision, bundle = installed_home(installed_homes, home, (OTHER_DIR,), marked=False)
    first, second = (Host(home, revision, bundle, remote_dir=d) for d in (REMOTE_DIR, OTHER_DIR))
    return first, second


def test_commit_and_activate_move_current_atomically_and_status_reports_every_directory(
    installed_homes: Path, tmp_path: Path
) -> None:
    host, other = unmarked_pair(installed_homes, tmp_path / "home")
    current = host.home / "Narwhal-deploy" / "current"
    host.install()
    assert os.readlink(current) == host.base.name
    assert (host.base / ".installed-files").read_text() == files_sha256(host.params["files"]) + "\n"
    other.install()
    assert os.readlink(current) == other.base.name
    activated = host.call("activate")
    assert (activated.outcome, activated.bytes_received) == ("activated", 0)
    assert os.readlink(current) == host.base.name
    assert not [p.name for p in current.parent.iterdir() if ".part-" in p.name]

    (host.base.parent / "notes.txt").write_text("operator's\n")
    (other.base / "checkout" / "README").write_text("changed\n")
    status = host.call("status", remote_base="Narwhal-deploy", known=known(host, other))
    assert (status.outcome, status.current) == ("listed", host.base.name)
    by_name = {d.name: d for d in status.deployments}
    assert by_name["notes.txt"].state == "foreign"
    assert (by_name[host.base.name].state, by_name[host.base.name].check) == ("installed", "intact")
    assert by_name[host.base.name].revision == host.params["revision"]
    assert by_name[other.base.name].check == "tampered"
    assert by_name[other.base.name].problem == "checkout: tracked files differ from the revision (left as they are)"
    refused = other.call("activate")
    assert (refused.outcome, refused.gate) == ("failed", "checkout")
    assert os.readlink(current) == host.base.name, "a failed activation never moves current"


def test_activate_needs_the_marker_and_staging_needs_current_to_be_a_symlink(
    installed_homes: Path, tmp_path: Path
) -> None:
    host, other = unmarked_pair(installed_homes, tmp_path / "home")
    inspected = other.call("inspect")
    missing = [n for n in other.payloads if inspected.files.get(n) != "present"]
    assert other.call("install", send=missing).outcome == "staged"
    (other.base / "installed").unlink()  # a deployment whose marker is gone since
    report = other.call("activate")
    assert (report.gate, report.message) == ("marker", "installed: missing (the install did not complete)")
    assert not (other.base.parent / "current").exists()
    (other.base.parent / "current").mkdir()
    report = host.stage()  # staging already refuses what activation would refuse: no host moves under --activate all
    assert (report.outcome, report.gate) == ("failed", "current")
    assert report.message == "current is a directory, not a link to a deployment (left as it is)"


def test_prune_never_removes_current_or_a_locked_deployment(installed_homes: Path, tmp_path: Path) -> None:
    third_dir = "Narwhal-deploy/" + "a" * 32
    home, revision, bundle = installed_home(installed_homes, tmp_path / "home", (OTHER_DIR, third_dir))
    host, other, third = (Host(home, revision, bundle, remote_dir=d) for d in (REMOTE_DIR, OTHER_DIR, third_dir))
    (third.base / ".install-lock").mkdir()  # no owner information: held
    (host.base.parent / f".removing-{'c' * 32}-999999999" / "checkout").mkdir(parents=True)  # a cut prune
    report = host.call("prune", remote_base="Narwhal-deploy",
                       remove=[host.base.name, other.base.name, third.base.name, "b" * 32])  # fmt: skip
    assert (report.removed, report.leftovers_removed) == ([other.base.name], 1)
    assert report.kept == {host.base.name: "current points at it",
                           third.base.name: ".install-lock is held by an unknown owner (no readable owner.json)",
                           "b" * 32: "not a deployment directory here"}  # fmt: skip
    assert sorted(p.name for p in host.base.parent.iterdir()) == sorted(["current", host.base.name, third.base.name])


def test_a_copy_links_venv_files_and_refuses_one_written_after_the_build(tmp_path: Path) -> None:
    """The copies tests start from share the built `.venv`'s files (hard links), copy every other file, and
    refuse to share a venv file some test wrote into after the build: that write reached every copy."""
    built = tmp_path / "built"
    (built / "checkout" / ".venv" / "bin").mkdir(parents=True)
    (built / "checkout" / ".venv" / "bin" / "python").write_text("interpreter")
    (built / "checkout" / "README").write_text("tracked")
    sealed_ns = time.time_ns()
    link_copy(built, tmp_path / "copy", sealed_ns)
    linked, copied = "checkout/.venv/bin/python", "checkout/README"
    assert (tmp_path / "copy" / linked).stat().st_ino == (built / linked).stat().st_ino
    assert (tmp_path / "copy" / copied).stat().st_ino != (built / copied).stat().st_ino
    os.utime(built / linked, ns=(sealed_ns + 10**9, sealed_ns + 10**9))  # written into a second after the build
    with pytest.raises(AssertionError, match=r"/built/checkout/\.venv/bin/python: written into after the build"):
        link_copy(built, tmp_path / "again", sealed_ns)

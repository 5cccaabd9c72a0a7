"""The per-host lease program run locally as a host runs it (bootstrap on stdin, its own HOME): one holder, a
lease that expires and is taken over (saying whose), fencing of every change the installer makes, and an exit
from every stuck state (`lock` explains it, `clear` removes it without following a link)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.host_program import run_host_program
from helpers.installer_host import HOLDER, Host, installed_home, lease, make_source

from narwhal_assets.host import program_stream
from narwhal_assets.protocols.lease import LeaseReport, lease_script, parse_lease_report

BASE = "Narwhal-deploy"


def call(home: Path, action: str, token: str = "", **params: object) -> LeaseReport:
    spec = {"token": token, "holder": params.pop("holder", HOLDER), "lease_s": params.pop("lease_s", 30.0), **params}
    script = lease_script({"remote_base": BASE, "action": action, "lease": spec})
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    done = run_host_program(program_stream(script), env, 30)
    assert done.returncode == 0, done.stderr
    return parse_lease_report(done.stdout)


def record(home: Path) -> Path:
    return home / BASE / ".lease"


def test_one_holder_then_refused_naming_it_then_released(tmp_path: Path) -> None:
    first = call(tmp_path, "acquire", "t1" * 16)
    assert first.outcome == "acquired" and first.state == "ours" and first.broken is None
    second = call(tmp_path, "acquire", "t2" * 16, holder={**HOLDER, "user": "bob"})
    assert second.outcome == "failed" and second.state == "held" and second.holder is not None
    assert second.holder.describe(second.now).startswith("alice@ws-1 (install of aaaaaaaaaaaa as 0123456789ab")
    assert "t1" * 16 not in record(tmp_path).read_text() and "t1" * 16 not in second.model_dump_json(), \
        "the token never leaves the workstation: the host keeps only its digest"  # fmt: skip
    assert call(tmp_path, "renew", "t2" * 16).outcome == "failed", "only the holder renews"
    assert call(tmp_path, "release", "t2" * 16).outcome == "not held", "only the holder releases"
    assert call(tmp_path, "release_dead", "t2" * 16).outcome == "failed", "a live holder is not released"
    assert call(tmp_path, "renew", "t1" * 16).outcome == "renewed"
    assert call(tmp_path, "release", "t1" * 16).outcome == "released"
    assert call(tmp_path, "show").holder is None
    assert call(tmp_path, "acquire", "t2" * 16).outcome == "acquired"


def test_an_expired_lease_is_taken_over_saying_whose_and_released_as_dead(tmp_path: Path) -> None:
    assert call(tmp_path, "acquire", "t1" * 16, lease_s=0.2).outcome == "acquired"
    time.sleep(0.4)
    shown = call(tmp_path, "show")
    assert shown.state == "expired" and "expired: the next operation takes it over" in shown.explain(shown.now)
    bob = {**HOLDER, "user": "bob", "pid": 2}
    taken = call(tmp_path, "acquire", "t2" * 16, holder=bob)
    assert taken.outcome == "acquired" and taken.broken is not None and taken.broken.user == "alice"
    assert call(tmp_path, "renew", "t1" * 16).outcome == "failed", "the old holder's renewal finds it taken over"
    assert call(tmp_path, "acquire", "t3" * 16).outcome == "failed", "bob's lease runs"
    alice_gone = {**{k: HOLDER[k] for k in ("workstation", "boot", "pid", "pid_start")}, "operation": ""}
    assert call(tmp_path, "release_dead", holder_gone=alice_gone).outcome == "failed", "bob was not proven gone"
    bob_gone = {**alice_gone, "pid": bob["pid"]}
    assert call(tmp_path, "acquire", "t3" * 16, holder_gone=bob_gone).broken.user == "bob"  # type: ignore[union-attr]
    assert call(tmp_path, "release_dead", holder_gone=bob_gone).outcome == "failed", "alice (t3) holds it now"
    assert call(tmp_path, "release_dead", holder_gone=alice_gone).outcome == "released"


def test_racing_takeovers_of_an_expired_lease_never_give_two_holders(tmp_path: Path) -> None:
    assert call(tmp_path, "acquire", "t0" * 16, lease_s=0.1).outcome == "acquired"
    time.sleep(0.3)
    with ThreadPoolExecutor(8) as pool:
        reports = list(pool.map(lambda i: call(tmp_path, "acquire", f"{i:02d}" * 16), range(8)))
    winners = [r for r in reports if r.outcome == "acquired"]
    assert len(winners) == 1, [r.outcome for r in reports]
    assert sum(r.broken is not None for r in reports) == 1


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "malformed", "not json"])
def test_a_stuck_record_refuses_every_taker_is_explained_and_cleared_without_following(
    tmp_path: Path, kind: str
) -> None:
    (tmp_path / BASE).mkdir(mode=0o700)
    where, victim = record(tmp_path), tmp_path / "victim"
    victim.write_text("keep me")
    if kind == "symlink":
        where.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "directory":
        (where / "inner").mkdir(parents=True)
    elif kind == "malformed":  # a well-formed JSON record with a holder field of the wrong type
        where.write_text(json.dumps({"schema": "narwhal.host-lease", "token_sha256": "x", "expires": 1.0,
                                     "holder": {**HOLDER, "pid": "abc"}}))  # fmt: skip
    else:
        where.write_text("{half")
    refused = call(tmp_path, "acquire", "t1" * 16)
    assert refused.outcome == "failed" and refused.state == "broken" and refused.problem
    assert "deploy-hosts lease --release --force" in (refused.message or "")
    shown = call(tmp_path, "show")
    assert shown.state == "broken" and shown.explain(shown.now).startswith("stuck: ")
    cleared = call(tmp_path, "clear")
    assert cleared.outcome == "cleared" and cleared.cleared == [".lease"]
    assert not os.path.lexists(where) and victim.read_text() == "keep me", "nothing behind a link is touched"
    assert call(tmp_path, "acquire", "t1" * 16).outcome == "acquired"


def test_a_half_written_record_is_free_and_its_leftover_goes_with_the_next_taker(tmp_path: Path) -> None:
    (tmp_path / BASE).mkdir(mode=0o700)
    (tmp_path / BASE / ".lease.part-12345").write_text('{"sche')  # a taker killed (or out of disk) mid-write
    shown = call(tmp_path, "show")
    assert shown.state == "absent" and shown.leftovers == [".lease.part-12345"]
    assert "free; half-written leftovers .lease.part-12345" in shown.explain(shown.now)
    assert call(tmp_path, "acquire", "t1" * 16).outcome == "acquired"
    assert sorted(p.name for p in (tmp_path / BASE).iterdir()) == [".lease"]


def test_an_earlier_versions_fleet_lock_is_shown_and_cleared(tmp_path: Path) -> None:
    (tmp_path / BASE / ".fleet-lock").mkdir(parents=True)
    (tmp_path / BASE / ".fleet-lock" / "owner.json").write_text("{}")
    assert call(tmp_path, "show").old_fleet_lock
    assert call(tmp_path, "clear").cleared == [".fleet-lock"]
    assert not (tmp_path / BASE / ".fleet-lock").exists()


def test_a_guard_held_elsewhere_fails_within_its_deadline(tmp_path: Path) -> None:
    (tmp_path / BASE).mkdir(mode=0o700)
    fd = os.open(tmp_path / BASE, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        began = time.monotonic()
        report = call(tmp_path, "acquire", "t1" * 16, guard_wait_s=0.5)
        assert time.monotonic() - began < 20
    finally:
        os.close(fd)
    assert report.outcome == "failed" and "stayed locked (flock) by another process for 0 s" in (report.message or "")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    return make_source(tmp_path_factory.mktemp("source"))


def test_an_operation_whose_lease_was_taken_over_changes_nothing_more(installed_homes: Path, tmp_path: Path) -> None:
    """Operation A stages under its lease, is paused past it, B takes the host over: A's activation and a new
    marker are refused on the host itself (gate `lease`), and `current` stays B's. Both deployments start as an
    install stopped before its marker leaves them (their virtualenvs are not this test's subject)."""
    home, revision, bundle = installed_home(installed_homes, tmp_path / "home", (f"{BASE}/{'b' * 32}",), marked=False)
    a = Host(home, revision, bundle)
    a.params["lease"] = lease("a" * 32, lease_s=0.3, release="never")
    inspected = a.call("inspect")
    assert inspected.lease is not None and inspected.lease.state == "ours"
    staged = a.call("install", send=list(a.payloads))
    assert staged.outcome == "staged", staged
    time.sleep(0.5)  # A is paused past its lease
    b = Host(home, revision, bundle, remote_dir=f"{BASE}/{'b' * 32}")
    b.params["lease"] = lease("b" * 32, holder={**HOLDER, "user": "bob"})
    assert b.call("inspect").lease.broken.user == "alice"  # type: ignore[union-attr]
    assert b.call("install", send=list(b.payloads)).outcome == "staged"
    assert b.call("activate").outcome == "activated"
    a.params["lease"] = lease("a" * 32, mode="hold")
    resumed = a.call("activate")
    assert (resumed.outcome, resumed.gate) == ("failed", "lease")
    assert "taken over" in (resumed.message or "") and "nothing more is changed" in (resumed.message or "")
    assert os.readlink(home / BASE / "current") == "b" * 32
    (a.base / "installed").unlink()
    assert a.call("install", send=[]).gate == "lease", "no marker is written without the lease either"
    assert not (a.base / "installed").exists()
    assert a.call("prune", remote_base=BASE, remove=["b" * 32]).gate == "lease"


@pytest.mark.parametrize("kind", ["file", "directory", "dangling", "elsewhere"])
def test_staging_refuses_a_current_that_activation_could_not_replace(
    tmp_path: Path, source: tuple[str, bytes], kind: str
) -> None:
    host = Host(tmp_path, *source)
    current = tmp_path / BASE / "current"
    current.parent.mkdir(mode=0o700)
    if kind == "file":
        current.write_text("x")
    elif kind == "directory":
        current.mkdir()
    elif kind == "dangling":
        current.symlink_to("f" * 32)
    else:
        current.symlink_to("/etc")
    for report in (host.call("inspect"), host.call("install", send=list(host.payloads))):
        assert (report.outcome, report.gate) == ("failed", "current"), report
    assert not (host.base / "installed").exists()

"""The fleet deploy lock program run locally as a host runs it (bootstrap on stdin, its own HOME): one holder,
a lease that runs out and is taken over (saying whose lock broke), release only by the holder or by force."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from narwhal_assets.protocols.fleet_lock import LockReport, lock_script, parse_lock_report
from narwhal_assets.protocols.install import BOOTSTRAP, install_stream

OWNER = {"user": "alice", "workstation": "ws-1", "command": "install", "revision": "a" * 40,
         "deployment_id": "0123456789abcdef0123456789abcdef", "message": "weekly", "since": "2026-12-02T00:00:00Z"}


def call(home: Path, action: str, token: str, **extra: object) -> LockReport:
    extra.setdefault("owner", OWNER)
    params = {"remote_base": "Narwhal-deploy", "lease_s": extra.pop("lease_s", 30.0), "action": action,
              "token": token, **extra}  # fmt: skip
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    done = subprocess.run(["/bin/sh", "-c", BOOTSTRAP], input=install_stream(lock_script(params)), env=env,
                          capture_output=True, timeout=30, check=False)  # fmt: skip
    return parse_lock_report(done.stdout)


def test_one_holder_then_refused_naming_it_then_released(tmp_path: Path) -> None:
    first = call(tmp_path, "acquire", "t1" * 8, owner=OWNER)
    assert first.outcome == "acquired" and first.broken is None
    second = call(tmp_path, "acquire", "t2" * 8, owner={**OWNER, "user": "bob"})
    assert second.outcome == "failed" and second.holder is not None
    described = second.holder.describe(second.now)
    assert described.startswith("alice@ws-1 (install of aaaaaaaaaaaa as 0123456789abcdef") and '"weekly"' in described
    assert "t1" not in json.dumps(second.model_dump()), "the holder's token is never shown"
    assert call(tmp_path, "release", "t2" * 8).outcome == "failed", "only the holder releases without force"
    assert call(tmp_path, "refresh", "t2" * 8).outcome == "failed", "only the holder refreshes"
    assert call(tmp_path, "refresh", "t1" * 8).outcome == "refreshed"
    assert call(tmp_path, "release", "t1" * 8).outcome == "released"
    assert call(tmp_path, "show", "").holder is None
    assert call(tmp_path, "acquire", "t2" * 8, owner=OWNER).outcome == "acquired"


def test_a_lease_not_refreshed_is_taken_over_and_says_whose_lock_broke(tmp_path: Path) -> None:
    assert call(tmp_path, "acquire", "t1" * 8, owner=OWNER).outcome == "acquired"
    assert call(tmp_path, "acquire", "t2" * 8, owner=OWNER, lease_s=30.0).outcome == "failed", "still fresh"
    time.sleep(1.2)
    shown = call(tmp_path, "show", "", lease_s=1.0)
    assert shown.stale and shown.holder is not None
    taken = call(tmp_path, "acquire", "t2" * 8, owner={**OWNER, "user": "bob"}, lease_s=1.0)
    assert taken.outcome == "acquired" and taken.broken is not None and taken.broken.user == "alice"
    assert call(tmp_path, "refresh", "t1" * 8).outcome == "failed", "the old holder lost it"
    assert sorted(p.name for p in (tmp_path / "Narwhal-deploy").iterdir()) == [".fleet-lock"], "nothing left over"


def test_racing_takeovers_of_a_stale_lock_never_give_two_holders(tmp_path: Path) -> None:
    """Many rounds of two deploys taking over one stale lock at once: exactly one wins each round."""
    for round_ in range(40):
        home = tmp_path / f"r{round_}"
        home.mkdir()
        stale = home / "Narwhal-deploy" / ".fleet-lock"
        stale.mkdir(parents=True)
        (stale / "owner.json").write_text(json.dumps({**OWNER, "token": "old", "refreshed": time.time() - 600}))
        with ThreadPoolExecutor(max_workers=2) as pool:
            reports = list(pool.map(call, [home, home], ["acquire", "acquire"], ["a" * 16, "b" * 16]))
        winners = [r for r in reports if r.outcome == "acquired"]
        assert len(winners) == 1, f"round {round_}: {[r.outcome for r in reports]}"
        holder = json.loads((home / "Narwhal-deploy" / ".fleet-lock" / "owner.json").read_text())
        assert holder["token"] in ("a" * 16, "b" * 16)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_symlink_or_fifo_where_the_lock_belongs_is_never_followed_or_opened(tmp_path: Path, kind: str) -> None:
    top = tmp_path / "Narwhal-deploy"
    top.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    if kind == "symlink":
        (top / ".fleet-lock").symlink_to(victim)
    else:
        (top / ".fleet-lock").mkdir()
        os.mkfifo(top / ".fleet-lock" / "owner.json")
    began = time.monotonic()
    report = call(tmp_path, "acquire", "t1" * 8, owner=OWNER)
    assert report.outcome == "failed" and time.monotonic() - began < 10
    assert list(victim.iterdir()) == []

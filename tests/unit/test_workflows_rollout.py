"""The fleet operation (`workflows.rollout`) on local hosts running the real installer and lease programs
(`helpers.local_hosts`): activation policies, the canary, failure ordering, the lease taken in host-id order
whatever the inventory's order, all or none, and connections bounded by `max_parallel`, in the unit tier."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.local_hosts import CHECK, DEPLOYMENT, FAIL_FLAG, LocalFleet, local_fleet

from narwhal_assets.core.errors import LeaseConflict
from narwhal_assets.workflows.install import HostOutcome, InstallCommands
from narwhal_assets.workflows.lease import LeaseRequest, OperationLease
from narwhal_assets.workflows.pool import ConnectionPool
from narwhal_assets.workflows.rollout import Progress, RolloutPlan, rollout

COMMANDS = InstallCommands(install="true", check=CHECK)


def run(fleet: LocalFleet, plan: RolloutPlan, request: LeaseRequest | None = None) -> dict[str, HostOutcome]:
    lease = OperationLease(request or LeaseRequest("install", deployment_id=DEPLOYMENT), lease_s=60.0)
    done: list[str] = []
    outcomes = rollout(fleet.connector, fleet.settings, fleet.entries, fleet.run, COMMANDS, plan, lease, Progress(),
                       lambda outcome: done.append(outcome.host_id))  # fmt: skip
    assert sorted(done) == sorted(o.host_id for o in outcomes), "every final outcome was handed over, once"
    return {o.host_id: o for o in outcomes}


def leases_left(fleet: LocalFleet) -> list[str]:
    return [e.id for e in fleet.entries if (fleet.home(e.id) / "Narwhal-deploy" / ".lease").exists()]


def plant_lease(fleet: LocalFleet, host_id: str) -> None:
    """Another operation's live lease on `host_id`."""
    record = fleet.home(host_id) / "Narwhal-deploy" / ".lease"
    record.parent.mkdir(mode=0o700, exist_ok=True)
    holder = {"user": "bob", "workstation": "elsewhere", "command": "install", "revision": "", "deployment_id": "",
              "message": "hotfix", "since": "", "boot": "", "pid": 1, "pid_start": "", "operation": ""}  # fmt: skip
    record.write_text(json.dumps({"schema": "narwhal.host-lease", "schema_version": 1, "token_sha256": "0" * 64,
                                  "holder": holder, "renewed": time.time(), "expires": time.time() + 600}))  # fmt: skip


def test_all_or_nothing_then_a_rerun_sends_nothing_to_the_staged_hosts(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, 3)
    (fleet.home("node-2") / FAIL_FLAG).touch()
    first = run(fleet, RolloutPlan())
    assert first["node-2"].gate == "check" and not first["node-2"].ok
    assert [first[h].activation for h in ("node-1", "node-3")] == ["not activated"] * 2
    assert [fleet.current(e.id) for e in fleet.entries] == [None] * 3, "no host moved"
    assert leases_left(fleet) == [], "every lease released"
    (fleet.home("node-2") / FAIL_FLAG).unlink()
    second = run(fleet, RolloutPlan())
    assert [(second[h].outcome, second[h].bytes_sent) for h in ("node-1", "node-3")] == [("reused", 0)] * 2
    assert second["node-2"].outcome == "installed" and all(o.activation == "activated" for o in second.values())
    assert [fleet.current(e.id) for e in fleet.entries] == [DEPLOYMENT] * 3 and leases_left(fleet) == []
    third = run(fleet, RolloutPlan())  # complete and current: released in its first call, nothing else
    assert all((o.outcome, o.activation) == ("reused", "already current") for o in third.values())


def test_each_serially_stops_at_the_first_failure_in_inventory_order(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, 3, order=[2, 1, 3])
    (fleet.home("node-1") / FAIL_FLAG).touch()
    outcomes = run(fleet, RolloutPlan(activate="each", max_parallel=1))
    assert list(outcomes) == ["node-2", "node-1"], "node-3 comes after the failure: never staged"
    assert fleet.current("node-2") == DEPLOYMENT and fleet.current("node-1") is None
    assert not (fleet.home("node-3") / "Narwhal-deploy" / DEPLOYMENT).exists() and leases_left(fleet) == []


def test_a_failing_canary_stages_no_other_host_and_none_moves_nothing(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, 3)
    (fleet.home("node-1") / FAIL_FLAG).touch()
    outcomes = run(fleet, RolloutPlan(canary=1))
    assert list(outcomes) == ["node-1"] and outcomes["node-1"].gate == "check"
    assert not any((fleet.home(h) / "Narwhal-deploy" / DEPLOYMENT).exists() for h in ("node-2", "node-3"))
    (fleet.home("node-1") / FAIL_FLAG).unlink()
    staged = run(fleet, RolloutPlan(activate="none"))
    assert all(o.staged and o.activation == "not activated" for o in staged.values())
    assert [fleet.current(e.id) for e in fleet.entries] == [None] * 3 and leases_left(fleet) == []


def test_leases_are_taken_in_host_id_order_all_or_none_with_connections_bounded(tmp_path: Path) -> None:
    """Inventory order 6..1, another operation holding node-5: every host is looked at in host-id order (one at a
    time here), nothing is staged anywhere, every lease taken is released, the holder is named."""
    fleet = local_fleet(tmp_path, 6, order=[6, 5, 4, 3, 2, 1])
    plant_lease(fleet, "node-5")
    with pytest.raises(LeaseConflict, match=r"another operation holds the lease on node-5;.*nothing was changed"):
        run(fleet, RolloutPlan(max_parallel=1))
    assert fleet.connector.contacted == [f"node-{n}" for n in range(1, 7)]
    assert leases_left(fleet) == ["node-5"], "only the other operation's lease is left"
    assert not any((fleet.home(e.id) / "Narwhal-deploy" / DEPLOYMENT).exists() for e in fleet.entries)
    with pytest.raises(LeaseConflict, match=r"held: bob@elsewhere \(install, since , expires in \d+ s\): \"hotfix\""):
        run(fleet, RolloutPlan(max_parallel=2))
    assert fleet.connector.peak <= 3 and fleet.connector.open_now == 0, "max_parallel + 1 at most, all closed"


def test_the_pool_keeps_a_connection_for_the_next_step_but_none_given_back_after_it_closed(tmp_path: Path) -> None:
    fleet = local_fleet(tmp_path, 2)
    pool = ConnectionPool(fleet.connector, fleet.settings, capacity=2)
    first, second = fleet.entries
    with pool.connection(first):
        pass
    with pool.connection(first):
        pass
    assert pool.opened == 1 and fleet.connector.open_now == 1, "the host's next step reused its connection"
    with pool.connection(second):
        pool.close()  # a step still running when the operation ends (a renewal, a cancelled host)
    assert fleet.connector.open_now == 0, "given back after close: closed, not kept where nobody closes it"

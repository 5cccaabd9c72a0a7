"""Install or roll back a prepared run on many hosts as one operation: lease, stage everywhere, then activate.

Phase 0 makes one read-only installer call to every selected host, in host-id order (never the inventory's),
that takes the operation's lease there and inspects the deployment (`workflows/lease.py`). A host where it is
complete and already current is released at once: there is nothing to do there. If another operation holds
any host's lease (or a host's lease record is stuck), the operation stops before anything changed: every
lease it took is released and the holders are named (`LeaseConflict`). An unreachable host fails alone.
Phase 1 stages the deployment on every host that lacks it (`install.stage_host`: transfer, clone, venv,
install and check commands, marker; `current` untouched). Phase 2 moves `current` (`install.activate_host`):
- `all` (default): only once every selected host staged, and only after every staged host's lease is known
  to be still the operation's (renewed first where it was not confirmed within half its length); if any host
  failed or any lease was taken over, no host moves;
- `each`: each host as soon as it staged (with `max_parallel` 1 in inventory order, the first failure stops
  the rest);
- `none`: no host moves; `rollback --run DIR` activates later.
`canary` N: the first N selected hosts (inventory order) are staged and activated, all-or-nothing, before any
other host is staged; if one fails, no other host is staged.

Every host checks the lease itself before each change, so hosts taken over while this operation was paused
refuse it (gate `lease`). Connections come from a pool of `max_parallel` + 1 (the one for lease renewals):
sessions, threads and file descriptors do not grow with the fleet. Each host's final outcome goes to `done`
as soon as it is known, so the asset records it at once; `cancel` (an interrupted command) stops starting
host work, and what is under way finishes and is recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from narwhal_assets.core.errors import LeaseConflict, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.manifest import PreparedRun
from narwhal_assets.protocols.install import Gate, InstallReport
from narwhal_assets.protocols.lease import LeaseHolder
from narwhal_assets.ssh.parallel import HOSTS_AT_ONCE, over_hosts
from narwhal_assets.ssh.transport import Connector
from narwhal_assets.workflows.install import (
    HostOutcome,
    InstallCommands,
    Mode,
    activate_host,
    connection_failed,
    hold_back,
    inspect_host,
    stage_host,
)
from narwhal_assets.workflows.lease import OperationLease, Renewer, lease_call, release_all
from narwhal_assets.workflows.pool import ConnectionPool

ActivatePolicy = Literal["all", "each", "none"]
T = TypeVar("T")
R = TypeVar("R")
DEFAULT_PARALLEL = HOSTS_AT_ONCE


@dataclass(frozen=True)
class RolloutPlan:
    mode: Mode = "install"
    activate: ActivatePolicy = "all"
    canary: int = 0
    max_parallel: int = DEFAULT_PARALLEL


@dataclass
class Progress:
    """Each host's phase and final outcome as the rollout goes; shared by an in-process command and the run it
    executes (the command's signal handler cancels, waits for `recorded`, and says where each host stopped)."""

    phases: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, HostOutcome] = field(default_factory=dict)
    broken: dict[str, LeaseHolder] = field(default_factory=dict)  # host id -> the stale lease taken over there
    cancel: threading.Event = field(default_factory=threading.Event)  # set: start no more host work
    recorded: threading.Event = field(default_factory=threading.Event)  # set: the work ended, every event stored
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, host_id: str, phase: str) -> None:
        with self._lock:
            self.phases[host_id] = phase

    def finish(self, outcome: HostOutcome) -> None:
        with self._lock:
            self.outcomes[outcome.host_id] = outcome
            self.phases[outcome.host_id] = f"done: {outcome.activation}"

    def lines(self) -> list[str]:
        """One line per host: where it stopped (for an interrupted command)."""
        with self._lock:
            return [f"host {host_id}: stopped {phase}" for host_id, phase in self.phases.items()]


def rollout(
    connector: Connector,
    settings: Settings,
    entries: Sequence[HostEntry],
    run: PreparedRun,
    commands: InstallCommands,
    plan: RolloutPlan,
    lease: OperationLease,
    progress: Progress,
    done: Callable[[HostOutcome], None] = lambda outcome: None,
    cancel: threading.Event | None = None,
) -> list[HostOutcome]:
    """Every selected host's final outcome, in the order of `entries`; a host never staged is not in it."""
    pool = ConnectionPool(connector, settings, plan.max_parallel + 1)
    operation = _Operation(pool, entries, run, commands, plan, lease, progress, done, cancel or threading.Event())
    try:
        with lease.active(), Renewer(pool, lease, operation.by_id):
            operation.run()
    finally:
        release_all(pool, lease, operation.by_id, plan.max_parallel)
        pool.close()
    return [progress.outcomes[e.id] for e in entries if e.id in progress.outcomes]


class _Operation:
    def __init__(self, pool: ConnectionPool, entries: Sequence[HostEntry], run: PreparedRun,
                 commands: InstallCommands, plan: RolloutPlan, lease: OperationLease, progress: Progress,
                 done: Callable[[HostOutcome], None], cancel: threading.Event) -> None:  # fmt: skip
        self.pool, self.entries, self.run_, self.commands, self.plan = pool, list(entries), run, commands, plan
        self.lease, self.progress, self.done, self.cancel = lease, progress, done, cancel
        self.by_id = {e.id: e for e in self.entries}
        self.inspected: dict[str, InstallReport | None] = {}

    def _final(self, outcome: HostOutcome) -> None:
        self.progress.finish(outcome)
        self.done(outcome)

    def run(self) -> None:
        candidates = self._take_leases()
        canary, rest = self.entries[: self.plan.canary], self.entries[self.plan.canary :]
        for group in (canary, rest):
            if not group or self.cancel.is_set():
                continue
            outcomes = self._group(group, candidates)
            if group is canary and not all(o.ok for o in outcomes):
                return  # a failed canary: no other host is staged

    # ----------------------------------------------------------------- phase 0

    def _take_leases(self) -> dict[str, HostOutcome]:
        """Lease and inspect every host (host-id order); the outcomes of the hosts that go on to phase 1."""

        def take(entry: HostEntry) -> HostOutcome | None:
            if self.cancel.is_set():
                return None
            self.progress.mark(entry.id, "while taking its lease: nothing changed")
            began = time.monotonic()
            try:
                with self.pool.connection(entry) as connection:
                    outcome, report = inspect_host(connection, self.run_, self.plan.mode, self.lease, True)
            except NarwhalError as exc:
                return connection_failed(entry.id, self.run_, exc, began)
            outcome.seconds = time.monotonic() - began
            self.inspected[entry.id] = report
            return outcome

        taken = [o for o in over_hosts(sorted(self.entries, key=lambda e: e.id), take, self.plan.max_parallel) if o]
        self.progress.broken.update(self.lease.broken)
        if self.lease.conflicts:
            raise LeaseConflict(self._conflict_lines())
        candidates: dict[str, HostOutcome] = {}
        for outcome in taken:
            if outcome.gate is not None:
                self._final(outcome)  # unreachable, or stopped at a gate while looking: nothing changed there
            elif outcome.staged and outcome.current_before == outcome.deployment_id:
                outcome.activation, outcome.current_after = "already current", outcome.current_before
                self._final(outcome)  # complete and current: released in the same call
            else:
                self.progress.mark(outcome.host_id, "leased, before staging: `current` not moved")
                candidates[outcome.host_id] = outcome
        return candidates

    def _conflict_lines(self) -> str:
        now = time.time()
        lines = [f"host {host_id}: {state.explain(now)}" for host_id, state in sorted(self.lease.conflicts.items())]
        return ("another operation holds the lease on " + ", ".join(sorted(self.lease.conflicts))
                + "; every lease this operation took was released and nothing was changed:\n  "
                + "\n  ".join(lines))  # fmt: skip

    # ----------------------------------------------------------------- phases 1 and 2

    def _group(self, group: list[HostEntry], candidates: dict[str, HostOutcome]) -> list[HostOutcome]:
        policy = self.plan.activate

        def stage(entry: HostEntry) -> HostOutcome | None:
            if entry.id not in candidates:  # done in phase 0 (failed, or complete and current)
                return self.progress.outcomes.get(entry.id)
            if self.cancel.is_set():
                return None
            outcome = candidates[entry.id]
            if not outcome.staged:
                self.progress.mark(entry.id, "while staging: `current` not moved")
                report = self.inspected.get(entry.id)
                assert report is not None  # a host that inspected without a gate has its report
                try:
                    with self.pool.connection(entry) as connection:
                        stage_host(connection, self.run_, self.commands, outcome, report, self.lease)
                except NarwhalError as exc:  # the reconnection failed
                    outcome.gate, outcome.message = Gate.CONNECTION.value, str(exc)
            if not outcome.staged:
                self._final(outcome)
                return outcome
            self.progress.mark(entry.id, "after staging: `current` not moved")
            if policy == "each":
                self._activate(outcome)
            return outcome

        results = [o for o in _each(group, stage, self.plan.max_parallel, stop_at_failure=policy == "each") if o]
        if policy == "each" or self.cancel.is_set():
            return results
        failed = [o.host_id for o in results if not o.staged]
        pending = [o for o in results if o.host_id in candidates]  # what phase 0 finished is recorded already
        if policy == "none":
            self._hold_back(pending, "--activate none")
        elif failed or len(results) < len(group):
            self._hold_back(pending, f"{', '.join(failed) or 'a host'} failed: no host was activated")
        else:
            lost = self._confirm_leases([o.host_id for o in pending])
            if lost:
                self._hold_back(pending, f"the lease on {', '.join(lost)} was taken over: no host was activated")
            else:
                _each(pending, self._activate, self.plan.max_parallel, stop_at_failure=False)
        return results

    def _confirm_leases(self, host_ids: list[str]) -> list[str]:
        """Before any host moves: renew the leases not confirmed recently (a pause may have let another
        operation take them); the hosts whose lease is no longer this operation's."""
        stale = self.lease.stale(host_ids, time.monotonic())
        over_hosts([self.by_id[h] for h in stale], lambda entry: lease_call(self.pool, self.lease, entry, "renew"),
                   self.plan.max_parallel)  # fmt: skip
        return sorted(h for h in host_ids if h in self.lease.lost or h not in self.lease.held)

    def _activate(self, outcome: HostOutcome) -> None:
        if self.cancel.is_set():
            return
        self.progress.mark(outcome.host_id, "while activating: `current` may have moved")
        try:
            with self.pool.connection(self.by_id[outcome.host_id]) as connection:
                activate_host(connection, self.run_, outcome, self.lease)
        except NarwhalError as exc:  # the reconnection failed: `current` was not touched
            outcome.activation, outcome.gate, outcome.message = "failed", Gate.CONNECTION.value, str(exc)
            outcome.current_after = outcome.current_before
        self._final(outcome)

    def _hold_back(self, outcomes: list[HostOutcome], why: str) -> None:
        staged = [o for o in outcomes if o.staged]
        hold_back(staged, why)
        for outcome in staged:
            self._final(outcome)


def _each(items: Sequence[T], work: Callable[[T], R], workers: int, *, stop_at_failure: bool) -> list[R]:
    """`work` over `items` with at most `workers` at once, results in order; serially, with `stop_at_failure`,
    the first failure stops the rest (results end there)."""
    if stop_at_failure and workers <= 1:
        results: list[R] = []
        for item in items:
            results.append(work(item))
            if not getattr(results[-1], "ok", True):
                break
        return results
    return over_hosts(items, work, workers)


def where_hosts_run(outcomes: Sequence[HostOutcome]) -> dict[str, list[str]]:
    """deployment id (or `unknown`) -> hosts, from what each host reported: after a partial activation,
    exactly which hosts now run which deployment."""
    placed: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.activation == "failed":
            lost = outcome.gate == Gate.CONNECTION.value
            where = "unknown (lost while activating)" if lost else outcome.current_before
        else:
            where = outcome.current_after if outcome.staged else outcome.current_before
        placed.setdefault(where or "none", []).append(outcome.host_id)
    return placed

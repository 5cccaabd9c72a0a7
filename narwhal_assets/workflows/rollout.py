"""Install or roll back a prepared run on many hosts as one operation: stage everywhere, then activate.

Phase 1 stages the deployment on every selected host over its one SSH connection (`install.stage_host`:
transfer, clone, venv, install and check commands, marker; `current` untouched), at most `max_parallel`
hosts at once. Phase 2 moves `current` (`install.activate_host`), over the same connections:
- `all` (default): only once every selected host staged; if any failed, no host moves;
- `each`: each host as soon as it staged (the upstream helper's per-host behaviour; with `max_parallel` 1
  hosts go in inventory order and the first failure stops the rest);
- `none`: no host moves; `rollback --run DIR` activates later.
`canary` N: the first N selected hosts (inventory order) are staged and activated, all-or-nothing, before any
other host is contacted; if one fails, no other host is touched.

Everything runs under the fleet lock (`fleet_lock.FleetLock`), checked again before phase 2. `Progress`
says where each host is, so an interrupted command can say where each one stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.protocols.fleet_lock import LockHolder
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.parallel import over_hosts
from narwhal_assets.ssh.transport import Connector, HostConnection
from narwhal_assets.workflows.install import (
    HostOutcome,
    InstallCommands,
    Mode,
    PreparedRun,
    activate_host,
    connection_failed,
    hold_back,
    stage_host,
)

ActivatePolicy = Literal["all", "each", "none"]
T = TypeVar("T")
R = TypeVar("R")
DEFAULT_PARALLEL = 8


@dataclass(frozen=True)
class RolloutPlan:
    mode: Mode = "install"
    activate: ActivatePolicy = "all"
    canary: int = 0
    max_parallel: int = DEFAULT_PARALLEL


@dataclass
class Progress:
    """Each host's phase as the rollout goes (read by another thread when the command is interrupted)."""

    phases: dict[str, str] = field(default_factory=dict)
    outcomes: list[HostOutcome] = field(default_factory=list)
    broken: LockHolder | None = None  # the stale fleet lock this rollout took over, if any
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, host_id: str, phase: str) -> None:
        with self._lock:
            self.phases[host_id] = phase

    def lines(self) -> list[str]:
        """One line per host: where it stopped (for an interrupted command)."""
        with self._lock:
            return [f"host {host_id}: stopped {phase}" for host_id, phase in self.phases.items()]


# In-process runs only: the command registers its Progress under a key it passes in the run config, so the
# job's op (same process) reports into it and the command can print where each host stopped.
_TRACKED: dict[str, Progress] = {}


def tracked(key: str) -> Progress:
    """The command's Progress for `key`, or a new one (a run launched from the UI has nobody watching)."""
    return _TRACKED.get(key) or Progress()


def rollout(
    connector: Connector,
    settings: Settings,
    entries: Sequence[HostEntry],
    run: PreparedRun,
    commands: InstallCommands,
    plan: RolloutPlan,
    progress: Progress,
    before_activation: Callable[[], None] = lambda: None,
) -> list[HostOutcome]:
    """Every selected host's outcome, in inventory order; hosts never contacted are not in the list."""
    canary, rest = list(entries[: plan.canary]), list(entries[plan.canary :])
    for group in (g for g in (canary, rest) if g):
        for entry in group:
            progress.mark(entry.id, "before connecting")
        policy: ActivatePolicy = "all" if group is canary and plan.activate == "none" else plan.activate
        outcomes = _group(connector, settings, group, run, commands, plan, policy, progress, before_activation)
        progress.outcomes += outcomes
        if group is canary and not all(o.ok for o in outcomes):
            break  # a failed canary: no other host is contacted
    return progress.outcomes


def _group(
    connector: Connector,
    settings: Settings,
    entries: list[HostEntry],
    run: PreparedRun,
    commands: InstallCommands,
    plan: RolloutPlan,
    policy: ActivatePolicy,
    progress: Progress,
    before_activation: Callable[[], None],
) -> list[HostOutcome]:
    opened: dict[str, HostConnection] = {}  # each host's one connection, kept from phase 1 to phase 2
    try:

        def stage(entry: HostEntry) -> HostOutcome:
            began = time.monotonic()
            progress.mark(entry.id, "while connecting")
            try:
                opened[entry.id] = connection = connector.connect(host_access(settings, entry))
            except NarwhalError as exc:
                progress.mark(entry.id, "unreachable: nothing changed there")
                return connection_failed(entry.id, run, exc, began)
            progress.mark(entry.id, "while staging: `current` not moved")
            outcome = stage_host(connection, run, commands, plan.mode)
            outcome.seconds = time.monotonic() - began
            progress.mark(entry.id, "after staging: `current` not moved" if outcome.staged else "at a failed gate")
            if policy == "each" and outcome.staged:
                before_activation()
                activate(outcome)
            return outcome

        def activate(outcome: HostOutcome) -> None:
            progress.mark(outcome.host_id, "while activating: `current` may have moved")
            activate_host(opened[outcome.host_id], run, outcome)
            progress.mark(outcome.host_id, f"done: {outcome.activation}")

        outcomes = _each(entries, stage, plan.max_parallel, stop_at_failure=policy == "each")
        if policy == "each":
            return outcomes
        failed = [o.host_id for o in outcomes if not o.staged]
        if policy == "none":
            hold_back(outcomes, "--activate none")
        elif failed or len(outcomes) < len(entries):
            hold_back(outcomes, f"{', '.join(failed)} failed: no host was activated")
        else:
            before_activation()
            _each(outcomes, activate, plan.max_parallel, stop_at_failure=False)
        return outcomes
    finally:
        for connection in opened.values():
            connection.close()


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


@contextmanager
def tracking(key: str) -> Iterator[Progress]:
    """Register a Progress for the life of one command."""
    progress = _TRACKED.setdefault(key, Progress())
    try:
        yield progress
    finally:
        _TRACKED.pop(key, None)


def where_hosts_run(outcomes: Sequence[HostOutcome]) -> dict[str, list[str]]:
    """deployment id (or `unknown`) -> hosts, from what each host reported: after a partial activation,
    exactly which hosts now run which deployment."""
    placed: dict[str, list[str]] = {}
    for outcome in outcomes:
        if outcome.activation == "failed":
            where = "unknown (lost while activating)" if outcome.gate == "connection" else outcome.current_before
        else:
            where = outcome.current_after if outcome.staged else outcome.current_before
        placed.setdefault(where or "none", []).append(outcome.host_id)
    return placed

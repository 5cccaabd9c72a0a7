"""Which deployment directories `prune` removes on hosts and the workstation, and when a host drifts:
pure decisions over what `status` reported and what Dagster recorded."""

from __future__ import annotations

import pytest

from narwhal_assets.core.deployment.live import Recorded, drifting
from narwhal_assets.core.deployment.prune import (
    HostDirectory,
    PreparedRunInfo,
    host_directories_to_remove,
    prepared_runs_to_remove,
)


def installed(name: str, at: float, current: bool = False) -> HostDirectory:
    return HostDirectory(name, "installed", at, current)


def test_the_newest_installed_stay_with_current_counted_among_them() -> None:
    found = [installed("a", 1), installed("b", 2, current=True), installed("c", 3), installed("d", 4)]
    assert host_directories_to_remove(found, keep=1) == ["a", "c", "d"]
    assert host_directories_to_remove(found, keep=2) == ["a", "c"]
    assert host_directories_to_remove(found, keep=4) == []


def test_locked_and_foreign_entries_stay_incomplete_ones_go() -> None:
    found = [installed("a", 1, current=True), HostDirectory("b", "locked", None, False),
             HostDirectory("notes", "foreign", None, False), HostDirectory("c", "incomplete", None, False),
             installed("d", 0)]  # fmt: skip
    assert host_directories_to_remove(found, keep=1) == ["c", "d"]


def test_without_current_the_newest_n_stay() -> None:
    assert host_directories_to_remove([installed("a", 5), installed("b", 9)], keep=1) == ["a"]
    with pytest.raises(ValueError):
        host_directories_to_remove([], keep=0)


def test_a_prepared_run_goes_only_when_old_absent_everywhere_and_not_current() -> None:
    runs = [PreparedRunInfo(f"r{n}", f"d{n}", f"2026-01-0{n}") for n in (4, 1, 3, 2, 5)]
    assert prepared_runs_to_remove(runs, keep=1, present=set(), current=set()) == ["r1", "r2", "r3", "r4"]
    assert prepared_runs_to_remove(runs, keep=2, present={"d2"}, current={"d1"}) == ["r3"]
    with pytest.raises(ValueError):
        prepared_runs_to_remove(runs, keep=0, present=set(), current=set())


def test_drift_is_a_newer_observation_of_another_deployment() -> None:
    installed_at = {"h1": Recorded("a", "r1", 10), "h2": Recorded("a", "r1", 10), "h3": Recorded("a", "r1", 30),
                    "h4": None, "h5": Recorded("a", "r1", 10)}  # fmt: skip
    live = {"h1": Recorded("a", "r1", 20), "h2": Recorded("b", "r2", 20), "h3": Recorded("b", "r2", 20),
            "h4": Recorded("c", "r3", 20), "h5": Recorded(None, None, 20), "h6": None}  # fmt: skip
    # h1 matches; h3 was installed after the observation; h6 was never observed
    assert drifting(installed_at, live) == ["h2", "h4", "h5"]

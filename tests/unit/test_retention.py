"""Retention of discovery runs and checkpoint table objects: pure decisions over run summaries."""

from __future__ import annotations

import pytest

from narwhal_assets.core.discovery.retention import RunInfo, keep_runs, objects_to_remove, runs_to_remove
from narwhal_assets.core.errors import InputError

NOW = 1_000_000.0
STALE = NOW - 7200


def run(name: str, complete: bool = True, active: float = 0.0) -> RunInfo:
    """Runs are ordered by name here: r1 is the oldest."""
    return RunInfo(name=name, complete=complete, order=(name,), last_activity=active)


def test_the_newest_complete_runs_stay_and_older_ones_go_oldest_first() -> None:
    runs = [run(f"r{n}") for n in (3, 1, 5, 2, 4)]
    assert runs_to_remove(runs, keep=2, current="r5", stale_before=STALE) == ["r1", "r2", "r3"]
    assert runs_to_remove(runs, keep=5, current="r5", stale_before=STALE) == []


def test_the_run_the_current_set_came_from_is_never_removed() -> None:
    runs = [run(f"r{n}") for n in range(1, 6)]
    assert runs_to_remove(runs, keep=1, current="r2", stale_before=STALE) == ["r1", "r3", "r4"]


def test_incomplete_runs_stay_while_recent_or_possibly_in_progress() -> None:
    runs = [
        run("r1", complete=False),  # stale failure, older than every kept run: removed
        run("r2"),
        run("r3", complete=False, active=NOW),  # old but still writing: maybe in progress
        run("r4"),
        run("r5", complete=False),  # newer than the oldest kept run: a recent failure worth reading
        run("r6"),
    ]
    assert runs_to_remove(runs, keep=2, current="r6", stale_before=STALE) == ["r1", "r2"]


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        runs_to_remove([run("r1")], keep=0, current=None, stale_before=STALE)


def test_objects_go_when_unreferenced_and_not_fresh() -> None:
    objects = {"a" * 64: STALE - 1, "b" * 64: STALE - 1, "c" * 64: NOW}
    assert objects_to_remove(objects, ["a" * 64], STALE) == ["b" * 64]


@pytest.mark.parametrize(("value", "expected"), [(None, 10), ("", 10), ("1", 1), ("250", 250)])
def test_keep_runs_setting(value: str | None, expected: int) -> None:
    assert keep_runs(value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "ten", "1e3", "\u0663", "10001", " 5"])
def test_keep_runs_setting_out_of_range_names_the_variable(value: str) -> None:
    with pytest.raises(InputError, match="NARWHAL_DISCOVERY_KEEP_RUNS must be a whole number from 1 to 10000"):
        keep_runs(value)

"""`profiling-limits.json`: limits equal the launch records' `--max-num-seqs` in `runtime.extra_args` (where the
serving fleet's profiler reads them), keyed by the fleet's iids."""

from __future__ import annotations

import json

import pytest
from helpers.launch_inputs import make_settings, two_hosts

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.fleet import Fleet, build_fleet
from narwhal_assets.core.launch.launch_records import EngineLaunchConfig, build_launch_records
from narwhal_assets.core.launch.profiling import build_profiling_limits, max_num_seqs

RECORDS = "/checkout/config/launch records.json"


def fleet_and_launch(settings=None) -> tuple[Fleet, EngineLaunchConfig]:
    settings = settings or make_settings()
    inventory, observations = two_hosts()
    launch = build_launch_records(settings, inventory, observations).config
    return build_fleet(settings, inventory, observations, launch), launch


def with_args(launch: EngineLaunchConfig, role: str, args: list[str]) -> EngineLaunchConfig:
    engines = dict(launch.engines)
    runtime = engines[role].runtime.model_copy(update={"extra_args": args})
    engines[role] = engines[role].model_copy(update={"runtime": runtime})
    return launch.model_copy(update={"engines": engines})


def test_limits_equal_the_launch_records() -> None:
    fleet, launch = fleet_and_launch(make_settings({"NARWHAL_NODE_2_MAX_NUM_SEQS": "32"}))
    limits = build_profiling_limits(fleet, launch, RECORDS)
    assert json.loads(render_json(limits)) == {"schema": "narwhal.profiling-limits", "schema_version": 1,
                                               "engines": {"n1": 8, "n2": 32}}
    for role, entry in launch.engines.items():
        args = entry.runtime.extra_args
        assert limits.engines["n" + role.split("-")[1]] == int(args[args.index("--max-num-seqs") + 1])
        assert entry.args[-len(args):] == args  # and the engine is started with them
    assert list(limits.engines) == [e.iid for e in fleet.engines]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-model-len", "8000"], "expected exactly one --max-num-seqs, found 0"),
        (["--max-num-seqs", "8", "--max-num-seqs=4"], "expected exactly one --max-num-seqs, found 2"),
        (["--max-num-seqs", "0"], "--max-num-seqs must be a positive integer"),
        (["--max-num-seqs", "-3"], "--max-num-seqs must be a positive integer"),
        (["--max-num-seqs"], "--max-num-seqs must be a positive integer"),
    ],
)
def test_a_record_without_a_single_positive_limit_is_refused(args: list[str], expected: str) -> None:
    fleet, launch = fleet_and_launch()
    with pytest.raises(InputError) as info:
        build_profiling_limits(fleet, with_args(launch, "engine-2", args), RECORDS)
    assert f"{RECORDS}: engines.engine-2.runtime.extra_args: {expected}" in str(info.value)


def test_equals_form_is_read() -> None:
    assert max_num_seqs(["/m", "--max-num-seqs=12"], "here") == 12


def test_keys_must_equal_the_fleet_iids() -> None:
    fleet, launch = fleet_and_launch()
    missing = launch.model_copy(update={"engines": {"engine-1": launch.engines["engine-1"]}})
    with pytest.raises(InputError, match="no record for fleet engine n2"):
        build_profiling_limits(fleet, missing, RECORDS)
    extra = launch.model_copy(update={"engines": {**launch.engines, "engine-7": launch.engines["engine-1"]}})
    with pytest.raises(InputError, match="n7 is not an engine of the fleet"):
        build_profiling_limits(fleet, extra, RECORDS)

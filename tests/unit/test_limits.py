"""The limits table (`core/limits.py`): lookups, the byte count, the policy check, and `docs/limits.md`."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.launch_inputs import make_settings

from narwhal_assets.core import limits
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import PATH_DEFAULTS
from narwhal_assets.core.launch.policy import resolve_engine_field

DOCS = Path(__file__).resolve().parents[2] / "docs" / "limits.md"
SECRET = "SENTINEL-value-"


@pytest.mark.parametrize(
    ("name", "maximum"),
    [
        ("NARWHAL_ENGINE_MODEL_NAME", 256),
        ("NARWHAL_NODE_7_ENGINE_MODEL_NAME", 256),
        ("NARWHAL_NODE_2_RUN_DIR", 1024),
        ("NARWHAL_ROUTER_SSH", 1024),
        ("NARWHAL_NODE_3_SSH", 1024),
        ("NARWHAL_ROUTER_SSH_PASSWORD", 512),
        ("NARWHAL_NODE_3_SSH_PASSWORD", 512),
        ("NARWHAL_SSH_CONFIG", 4095),
        ("NARWHAL_ROUTER_URL", limits.VALUE_BYTES),
        ("NARWHAL_NODE_0123_RUN_DIR", limits.VALUE_BYTES),  # not a node variable: the general maximum
        ("HOME", limits.VALUE_BYTES),
    ],
)
def test_maximum_by_variable(name: str, maximum: int) -> None:
    assert limits.maximum(name) == maximum


def test_every_path_variable_has_the_path_limit() -> None:
    assert {f"NARWHAL_{field}" for field in limits.PATH_FIELDS} == {*PATH_DEFAULTS, "NARWHAL_SSH_CONFIG"}


def test_too_long_counts_utf8_bytes_and_never_quotes_the_value() -> None:
    name = "NARWHAL_ENGINE_MODEL_NAME"
    assert limits.too_long(name, "m" * 256) is None
    assert limits.too_long(name, "m" * 257) == f"{name}: value is longer than 256 bytes (see docs/limits.md)"
    assert limits.too_long(name, "é" * 128) is None  # 256 bytes
    assert limits.too_long(name, "é" * 129) is not None  # 129 characters, 258 bytes
    problem = limits.too_long("NARWHAL_NODE_1_SSH_PASSWORD", SECRET * 100)
    assert problem is not None and "SENTINEL" not in problem


def test_the_launch_policy_bounds_values_however_settings_were_built() -> None:
    """Settings built in code (no file, no process layer) still cannot carry a 1 MB model name into a launch."""
    huge = make_settings(dotenv={"NARWHAL_ENGINE_MODEL_NAME": "m" * (1 << 20)})
    with pytest.raises(InputError) as info:
        resolve_engine_field(huge, 1, "ENGINE_MODEL_NAME")
    assert info.value.problems == [
        "engine-1: NARWHAL_ENGINE_MODEL_NAME: value is longer than 256 bytes (see docs/limits.md)"
    ]
    override = make_settings(process={"NARWHAL_NODE_2_EXTRA_ENGINE_ARGS": "--seed 1 " * 1000})
    assert resolve_engine_field(override, 1, "EXTRA_ENGINE_ARGS").value == ""
    with pytest.raises(InputError) as info:
        resolve_engine_field(override, 2, "EXTRA_ENGINE_ARGS")
    assert info.value.problems == [
        "engine-2: NARWHAL_NODE_2_EXTRA_ENGINE_ARGS: value is longer than 4096 bytes (see docs/limits.md)"
    ]


def test_docs_list_every_limit_as_in_the_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `NARWHAL_")]
    assert len(rows) == len(limits.LIMITS)
    for limit, row in zip(limits.LIMITS, rows, strict=True):
        for field in limit.fields:
            assert f"`NARWHAL_{field}`" in row or f"`NARWHAL_NODE_<n>_{field}`" in row, (field, row)
        assert f"| {limit.maximum} | {limit.why} |" in row
    assert f"| {limits.ENV_FILE_BYTES} bytes (1 MiB) |" in text
    assert f"| {limits.ENV_FILE_LINES} lines |" in text
    assert f"(`NARWHAL_HOSTS`, default `config/hosts.local.json`) | {limits.INVENTORY_FILE_BYTES} bytes" in text
    assert f"any assignment in an assignment file | {limits.VALUE_BYTES} |" in text

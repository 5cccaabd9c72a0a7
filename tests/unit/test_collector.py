"""`local/collector`: the cyclic collector off while a command loads, frozen heap at a command process's exit."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal_assets.cli.main import main
from narwhal_assets.local import collector


@pytest.fixture(autouse=True)
def collector_on() -> None:
    gc.enable()
    assert gc.get_freeze_count() == 0


def test_off_while_loading_then_frozen_and_on_then_restored() -> None:
    garbage: list[object] = []
    with collector.paused_while_loading():
        assert not gc.isenabled()
        garbage.append(garbage)  # a cycle made while loading is kept (frozen), not collected
        collector.loaded()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        collector.loaded()  # once only: a second call freezes nothing more
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_caller_that_had_it_off_gets_it_back_off() -> None:
    gc.disable()
    try:
        with collector.paused_while_loading():
            collector.loaded()
            assert gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_loaded_outside_a_command_changes_nothing() -> None:
    gc.disable()
    try:
        collector.loaded()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_command_that_never_opens_the_instance_leaves_the_callers_collector_on(tmp_path: Path) -> None:
    assert main(["--root", str(tmp_path), "status"]) == 2  # no .env: an input error, before Dagster loads
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_executable_ends_with_its_heap_frozen(tmp_path: Path) -> None:
    code = ("import gc, sys\nfrom narwhal_assets.cli.main import command\n"
            f"sys.argv = ['deploy-hosts', '--root', {str(tmp_path)!r}, 'status']\n"
            "rc = command()\nprint(rc, gc.get_freeze_count() > 0)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["2", "True"]
    assert f"{tmp_path}/.env" in done.stderr  # the input error, said in one line

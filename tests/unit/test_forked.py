"""`local/forked`: a function run in a forked child (status asks the hosts there while Dagster loads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers.polling import wait_for

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.local.forked import forked


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_result_comes_back_from_another_process() -> None:
    with forked(lambda: (os.getpid(), {"hosts": ["node-1"]})) as child:
        pid, result = child.join()
    assert pid != os.getpid() and result == {"hosts": ["node-1"]}
    assert not alive(pid)


def test_an_input_error_crosses_with_its_problems_and_other_errors_with_their_message() -> None:
    def bad_input() -> None:
        raise InputError(["a: wrong", "b: missing"])

    def failed() -> None:
        raise NarwhalError("host node-2: unreachable")

    with forked(bad_input) as child, pytest.raises(InputError) as raised:
        child.join()
    assert raised.value.problems == ["a: wrong", "b: missing"]
    with forked(failed) as child, pytest.raises(NarwhalError, match=r"^host node-2: unreachable$"):
        child.join()


def test_leaving_without_the_result_kills_the_child(tmp_path: Path) -> None:
    marker = tmp_path / "pid"

    def slow() -> None:
        marker.write_text(str(os.getpid()))
        time.sleep(60)

    with forked(slow):
        wait_for(marker.exists, "the child started", 10)
        pid = int(marker.read_text())
        assert alive(pid)
    assert not alive(pid)


def test_with_another_thread_running_the_work_runs_inline() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with forked(os.getpid) as child:
            assert child.join() == os.getpid()
    finally:
        stop.set()
        other.join()


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent SIGKILLed while its child works leaves no child behind."""
    script = textwrap.dedent("""
        import os, sys, time
        from narwhal_assets.local.forked import forked
        with forked(lambda: time.sleep(60)) as child:
            print(child._pid, flush=True)
            time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert alive(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_for(lambda: not alive(pid), "the child died with its parent", 10)
    finally:
        parent.kill()
        parent.wait()

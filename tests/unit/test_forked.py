"""`local/forked`: a function run in a forked child (status asks the hosts there while Dagster loads)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from helpers.polling import wait_for
from helpers.procfs import alive

from narwhal_assets.local.forked import forked


def in_a_fresh_process(body: str) -> list[str]:
    """`body` run by a new interpreter, the only thread there: this test process may still hold threads of
    earlier tests (an SSH transport ending), and with another thread running `forked` works inline by design."""
    prelude = "import json, os, sys, time\nfrom narwhal_assets.core.errors import InputError, NarwhalError\n"
    prelude += "from narwhal_assets.local.forked import forked\n"
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_the_result_comes_back_from_another_process() -> None:
    [line] = in_a_fresh_process("""
        with forked(lambda: (os.getpid(), {"hosts": ["node-1"]})) as child:
            pid, result = child.join()
        print(json.dumps([os.getpid(), pid, result]))
    """)
    parent, pid, result = json.loads(line)
    assert pid != parent and result == {"hosts": ["node-1"]}
    assert not alive(pid)


def test_an_input_error_crosses_with_its_problems_and_other_errors_with_their_message() -> None:
    lines = in_a_fresh_process("""
        def bad_input():
            raise InputError(["a: wrong", "b: missing"])

        def failed():
            raise NarwhalError("host node-2: unreachable")

        for work in (bad_input, failed):
            try:
                with forked(work) as child:
                    child.join()
            except InputError as exc:
                print(json.dumps(["input", exc.problems]))
            except NarwhalError as exc:
                print(json.dumps([type(exc).__name__, str(exc)]))
    """)
    assert [json.loads(line) for line in lines] == [
        ["input", ["a: wrong", "b: missing"]], ["NarwhalError", "host node-2: unreachable"]
    ]  # fmt: skip


def test_leaving_without_the_result_kills_the_child(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    [line] = in_a_fresh_process(f"""
        marker = {str(marker)!r}

        def slow():
            with open(marker + ".part", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".part", marker)
            time.sleep(60)

        with forked(slow):
            deadline = time.monotonic() + 20
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            pid = int(open(marker).read())
            running = os.path.exists(f"/proc/{{pid}}")
        print(json.dumps([pid, running, os.path.exists(f"/proc/{{pid}}")]))  # reaped when the block ends
    """)
    pid, running, after = json.loads(line)
    assert running and not after
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

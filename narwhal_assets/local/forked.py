"""Run one function in a forked child while this process goes on: two CPUs instead of one interpreter.

`status` spends its time in two independent parts: asking the hosts (SSH, mostly waiting) and importing
Dagster and its SQL storage to record the answers (CPU-bound Python). Threads share one interpreter lock;
a forked child does not, so the hosts are asked while Dagster loads. The child dies with its parent
(`PR_SET_PDEATHSIG`) and is killed and reaped if the parent leaves early; it prints nothing. A result
crosses back pickled (the child is this very program, so the bytes are trusted); a `NarwhalError` crosses
as its problems or message. Forking only happens while this process has a single thread: a thread's locks
would be copied held. Otherwise `work` just runs inline, at `join`.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Generic, TypeVar

from narwhal_assets.core.errors import InputError, NarwhalError

T = TypeVar("T")
PR_SET_PDEATHSIG = 1


class Forked(Generic[T]):
    """A started child; `join()` is its result (or its error, raised here)."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        self._pid: int | None = None
        self._read = -1
        if threading.active_count() == 1:
            self._start()

    def _start(self) -> None:
        read, write = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read)
            _child(self._work, write, parent)
        os.close(write)
        self._pid, self._read = pid, read

    def join(self) -> T:
        if self._pid is None:
            return self._work()
        with os.fdopen(self._read, "rb") as pipe:
            data = pipe.read()
        self._read = -1
        self._reap()
        if not data:
            raise NarwhalError("the forked child ended without a result")
        kind, value = pickle.loads(data)  # noqa: S301 (written by our own forked child, not by a host)
        if kind == "input":
            raise InputError(value)
        if kind == "error":
            raise NarwhalError(value)
        return value  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Kill and reap the child if it is still there (the parent is leaving without its result)."""
        if self._pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._reap()
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def _reap(self) -> None:
        if self._pid is not None:
            with suppress(ChildProcessError):
                os.waitpid(self._pid, 0)
            self._pid = None


@contextmanager
def forked(work: Callable[[], T]) -> Iterator[Forked[T]]:
    """`work` started in a child; leaving the block without `join()` kills the child."""
    child = Forked(work)
    try:
        yield child
    finally:
        child.stop()


def _child(work: Callable[[], object], write: int, parent: int) -> None:
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(code)
        try:
            result: tuple[str, object] = ("ok", work())
        except InputError as exc:
            result = ("input", exc.problems)
        except NarwhalError as exc:
            result = ("error", str(exc))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(pickle.dumps(result))
        code = 0
    finally:  # KeyboardInterrupt included: no traceback from the child, no exit handlers of the parent
        os._exit(code)

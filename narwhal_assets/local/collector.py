"""CPython's cyclic garbage collector held off while a command loads its modules.

A command's fixed cost is mostly imports (Dagster, its SQL storage, pydantic models). Each allocates thousands
of objects that live as long as the process, and the collector's full passes walk that growing heap again and
again: opening the instance in a new process took 2.8-3.3 s with the collector running and 2.2-2.3 s without
it (`benchmarks/bench_cli.py` measures the commands). Nothing a module load creates is garbage, so
`deploy-hosts` runs with the collector off until the heavy loading is done (`loaded`, once the Dagster
instance is open); what exists then is frozen, never scanned again, and collection resumes for the command's
own work, however long it runs. `deploy-hosts ui` supervises for hours and resumes it at once; a command that
never opens the instance (plan, check-access) is short and ends with it off. On leaving, the caller's
collector state is restored (tests call `main` in their own process). When the command is the whole process,
`exiting` freezes the heap before the interpreter finalizes: its shutdown otherwise collects the whole heap
several times (1.2 s after a `status`, 0.06 s frozen); nothing left then needs collecting, and `atexit`
handlers (the SQLite connections) still run.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False


@contextmanager
def paused_while_loading() -> Iterator[None]:
    """Run the body with the collector off until `loaded()`; afterwards as it was before."""
    global _paused
    was_enabled = gc.isenabled()
    gc.disable()
    _paused = True
    try:
        yield
    finally:
        _paused = False
        gc.unfreeze()
        (gc.enable if was_enabled else gc.disable)()


def exiting() -> None:
    """The process ends now: its finalization skips the heap that is left."""
    gc.freeze()


def loaded() -> None:
    """The heavy modules are in: freeze what exists and let the collector run again (no-op outside
    `paused_while_loading`, or when already resumed)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()

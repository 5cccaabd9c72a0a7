"""Why every test starts with pytest's own SIGINT/SIGTERM: Dagster on the main thread remaps SIGTERM."""

from __future__ import annotations

import signal

import dagster as dg
from helpers.signals import STARTING, restore_starting_dispositions


@dg.asset
def one() -> int:
    return 1


def test_a_main_thread_run_leaves_sigterm_as_sigint_and_the_restore_undoes_it() -> None:
    """Under a SIGINT ignored (as `cmd &` starts pytest), a main-thread `materialize` leaves SIGTERM ignored
    too, which every process started afterwards would inherit; the restore puts pytest's own back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert dg.materialize([one]).success
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # Dagster's remapping, still there
    finally:
        restore_starting_dispositions()
    assert {s: signal.getsignal(s) for s in STARTING} == STARTING

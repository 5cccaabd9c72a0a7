"""SIGINT and SIGTERM as pytest started, restored before each test (`tests/conftest.py`).

Dagster run on a test's main thread (`materialize`, `execute_in_process`) leaves SIGTERM mapped to SIGINT's
disposition; under a SIGINT ignored (a CI runner, `cmd &`) every process a later test starts would then ignore
SIGTERM. The product runs Dagster on a worker thread, where it sets no handler."""

from __future__ import annotations

import signal

STARTING = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}


def restore_starting_dispositions() -> None:
    for signum, disposition in STARTING.items():
        if disposition is not None and signal.getsignal(signum) != disposition:
            signal.signal(signum, disposition)

"""Freshness of the discovered set: Dagster's own freshness policy on every discovery asset.

A discovered set older than `NARWHAL_DISCOVERY_MAX_AGE` (default 8 days: the weekly full re-hash plus a day)
is *Failing* its freshness in the UI, and *Warning* from three quarters of that age; Dagster's daemon
evaluates it (`deploy-hosts ui` runs one), so no check or sensor of ours has to re-evaluate a clock.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dagster as dg

from narwhal_assets.core.discovery.watch import parse_duration
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import Settings

MAX_AGE_VARIABLE = "NARWHAL_DISCOVERY_MAX_AGE"
DEFAULT_MAX_AGE = "8d"
DEFAULT_MAX_AGE_S = parse_duration(MAX_AGE_VARIABLE, DEFAULT_MAX_AGE)


def max_age_s(root: Path) -> int:
    """`NARWHAL_DISCOVERY_MAX_AGE` of the checkout at `root`, in seconds; the default when the checkout's files
    cannot be read or the value is not a duration (the code location still loads; discovery names the file)."""
    try:
        text = Settings.load(root).get(MAX_AGE_VARIABLE)
        return parse_duration(MAX_AGE_VARIABLE, text) if text else DEFAULT_MAX_AGE_S
    except InputError:
        return DEFAULT_MAX_AGE_S


def discovery_freshness(root: Path) -> dg.FreshnessPolicy:
    seconds = max_age_s(root)
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(seconds=seconds),
                                          warn_window=timedelta(seconds=seconds * 3 // 4))  # fmt: skip

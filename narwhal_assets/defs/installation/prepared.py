"""Which prepared run an install may use: only one whose prepare checks all passed.

`prepare_job` materializes `deployment_manifest` and then runs the prepare checks (the bundle clones to the
revision, the files are private, no file holds management access). A run whose check failed is still the
latest materialization, so the install picks the latest one whose checks all passed in its own run, and an
explicit directory whose checks failed is refused naming the check.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, PREPARE_CHECK_NAMES, PREPARE_COMMAND

SCAN = 50  # prepared runs looked at, newest first


def checked_prepared_run(instance: dg.DagsterInstance, run_dir: Path | None) -> Path:
    """`run_dir` when no recorded prepare of it failed a check (one this instance never saw is verified by its
    manifest alone); else the newest prepared run whose checks all passed."""
    records = instance.fetch_materializations(DEPLOYMENT_MANIFEST, limit=SCAN).records
    seen: set[Path] = set()  # a directory's newest prepare is the one that made what is in it
    for record in records:
        materialization = record.asset_materialization
        if materialization is None or "out" not in materialization.metadata:
            continue
        out = Path(str(materialization.metadata["out"].value))
        if out.resolve() in seen or (run_dir is not None and out.resolve() != run_dir.resolve()):
            continue
        seen.add(out.resolve())
        failed = failed_checks(instance, record.run_id)
        if not failed:
            return out
        if run_dir is not None:
            raise InputError([f"--run {run_dir}: prepare check {', '.join(failed)} failed for it; fix the cause and "
                              "prepare a new run"])  # fmt: skip
    if run_dir is not None:
        return run_dir
    if not records:
        raise NarwhalError(f"deployment_manifest has never been materialized; run `{PREPARE_COMMAND}`")
    raise NarwhalError(f"no prepared run among the latest {len(records)} passed every prepare check "
                       f"({', '.join(PREPARE_CHECK_NAMES)}); run `{PREPARE_COMMAND}`")  # fmt: skip


def failed_checks(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The prepare checks that failed, or did not run, in the prepare run `run_id`."""
    passed: dict[str, bool] = {}
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records:
        evaluation = record.event_log_entry.asset_check_evaluation
        if evaluation is not None and evaluation.check_name in PREPARE_CHECK_NAMES:
            passed[evaluation.check_name] = passed.get(evaluation.check_name, True) and evaluation.passed
    return [name for name in PREPARE_CHECK_NAMES if not passed.get(name, False)]

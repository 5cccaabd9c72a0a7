"""Checks that are evaluated both outside a run (a sensor or a command reports the evaluation runless) and
as a step in a run: one evaluation, turned into the step's result here."""

import dagster as dg


def as_result(evaluation: dg.AssetCheckEvaluation) -> dg.AssetCheckResult:
    """The result a check step yields for an evaluation computed by the same rule outside a run."""
    return dg.AssetCheckResult(passed=evaluation.passed, description=evaluation.description,
                               metadata=evaluation.metadata, severity=evaluation.severity)  # fmt: skip

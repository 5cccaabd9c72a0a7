"""Freshness of the discovered set: an asset check on `host_observations`, and a sensor that re-evaluates it.

The check runs with every discovery (then it passes); between discoveries only time changes its answer, so
`discovery_freshness_sensor` reports a fresh evaluation every few minutes without launching a run.
"""

import time

import dagster as dg

from narwhal_assets.core.discovery.watch import parse_duration
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.defs.discovery.assets import OBSERVATIONS
from narwhal_assets.defs.evaluations import as_result
from narwhal_assets.defs.resources import ManagementCheckout

MAX_AGE_VARIABLE = "NARWHAL_DISCOVERY_MAX_AGE"
DEFAULT_MAX_AGE = "8d"  # the weekly full re-hash plus a day
CHECK_NAME = "discovered_set_fresh"
SENSOR_TICK_S = 300


def evaluate_freshness(
    instance: dg.DagsterInstance, checkout: ManagementCheckout, now: float
) -> dg.AssetCheckEvaluation:
    """Stale when the latest `host_observations` materialization is older than NARWHAL_DISCOVERY_MAX_AGE."""
    try:
        settings = Settings.load(checkout.path)
        max_age = parse_duration(MAX_AGE_VARIABLE, settings.get(MAX_AGE_VARIABLE) or DEFAULT_MAX_AGE)
    except InputError as exc:
        return _evaluation(False, f"freshness not evaluated: {exc}", {})
    event = instance.get_latest_materialization_event(OBSERVATIONS)
    if event is None:
        return _evaluation(False, "never discovered: run discovery_job", {"max_age_s": max_age})
    age = int(now - event.timestamp)
    metadata = {"age_s": age, "max_age_s": max_age, "discovery_run_id": event.run_id}
    if age > max_age:
        return _evaluation(False, f"stale: discovered {age} s ago, over {MAX_AGE_VARIABLE} ({max_age} s)", metadata)
    return _evaluation(True, f"fresh: discovered {age} s ago (limit {max_age} s)", metadata)


def _evaluation(passed: bool, description: str, metadata: dict[str, object]) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=OBSERVATIONS,
        check_name=CHECK_NAME,
        passed=passed,
        description=description,
        metadata=metadata,
        severity=dg.AssetCheckSeverity.WARN,
    )


@dg.asset_check(
    asset=OBSERVATIONS,
    name=CHECK_NAME,
    description=f"The discovered set is younger than {MAX_AGE_VARIABLE} (default {DEFAULT_MAX_AGE})",
)
def discovered_set_fresh(context: dg.AssetCheckExecutionContext, checkout: ManagementCheckout) -> dg.AssetCheckResult:
    found = evaluate_freshness(context.instance, checkout, time.time())
    return as_result(found)


@dg.sensor(name="discovery_freshness_sensor", minimum_interval_seconds=SENSOR_TICK_S,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description=f"Re-evaluates {CHECK_NAME} every {SENSOR_TICK_S // 60} minutes (no run, no SSH), so a "
           "discovered set older than NARWHAL_DISCOVERY_MAX_AGE shows as stale in the UI.")  # fmt: skip
def discovery_freshness_sensor(context: dg.SensorEvaluationContext, checkout: ManagementCheckout) -> dg.SensorResult:
    return dg.SensorResult(asset_events=[evaluate_freshness(context.instance, checkout, time.time())])

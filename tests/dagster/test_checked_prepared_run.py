"""An install takes only a prepared run whose prepare checks all passed: the newest such run when none is named,
and a named one whose check failed is refused naming the check (a real instance; the prepare runs are a stand-in
asset that records what `prepare_job` records)."""


from pathlib import Path

import dagster as dg
import pytest

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.defs.installation.prepared import checked_prepared_run
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, PREPARE_CHECK_NAMES


class Prepared(dg.Config):
    out: str
    failing: list[str] = []


@dg.asset(key=DEPLOYMENT_MANIFEST, check_specs=[dg.AssetCheckSpec(n, asset=DEPLOYMENT_MANIFEST)
                                                for n in PREPARE_CHECK_NAMES])  # fmt: skip
def deployment_manifest(config: Prepared) -> dg.MaterializeResult:
    results = [dg.AssetCheckResult(check_name=n, passed=n not in config.failing) for n in PREPARE_CHECK_NAMES]
    return dg.MaterializeResult(metadata={"out": dg.MetadataValue.path(config.out)}, check_results=results)


def prepare(instance: dg.DagsterInstance, out: Path, *failing: str) -> None:
    config = {"ops": {"deployment_manifest": {"config": {"out": str(out), "failing": list(failing)}}}}
    assert dg.materialize([deployment_manifest], instance=instance, run_config=config).success


def test_the_newest_checked_run_is_installed_and_a_named_run_with_a_failed_check_is_refused(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    with dg.instance_for_test() as instance:
        with pytest.raises(NarwhalError, match="never been materialized"):
            checked_prepared_run(instance, None)
        prepare(instance, good)
        prepare(instance, bad, "prepared_files_hold_no_access")
        assert checked_prepared_run(instance, None) == good, "the latest run failed a check: the one before it"
        with pytest.raises(InputError, match="prepare check prepared_files_hold_no_access failed"):
            checked_prepared_run(instance, bad)
        assert checked_prepared_run(instance, good) == good
        unknown = tmp_path / "elsewhere"
        assert checked_prepared_run(instance, unknown) == unknown, "never prepared here: its manifest decides"
        prepare(instance, good, "bundle_clones_to_revision")  # prepared again into it, and this time it failed
        with pytest.raises(NarwhalError, match="no prepared run among the latest 3 passed every prepare check"):
            checked_prepared_run(instance, None)


def test_the_prepare_checks_named_are_the_ones_prepare_runs() -> None:
    from narwhal_assets.defs.prepare.assets import PREPARE_CHECKS

    assert {key.name for check in PREPARE_CHECKS for key in check.check_keys} == set(PREPARE_CHECK_NAMES)

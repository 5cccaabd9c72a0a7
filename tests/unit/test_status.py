"""Live-deployment observations and the drift check on a real (ephemeral) Dagster instance, without hosts:
what `deploy-hosts status` records, and the check as Dagster runs it, share one rule."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.defs.installation.status import live_matches_installed, record_statuses
from narwhal_assets.defs.keys import INSTALLATION
from narwhal_assets.defs.partitions import HOSTS_PARTITIONS_NAME
from narwhal_assets.protocols.install import DeploymentEntry
from narwhal_assets.workflows.status import HostStatus

A, B = "a" * 32, "b" * 32


def installed(instance: dg.DagsterInstance, host_id: str, deployment_id: str) -> None:
    metadata = {"outcome": "installed", "deployment_id": deployment_id, "revision": deployment_id[:1] * 40}
    instance.report_runless_asset_event(dg.AssetMaterialization(INSTALLATION, partition=host_id, metadata=metadata))


def live(host_id: str, current: str | None) -> HostStatus:
    entries = [DeploymentEntry(name=n, state="installed", revision=n[:1] * 40, check="intact") for n in (A, B)]
    return HostStatus(host_id, ["engine-1"], current=current, deployments=entries)


def test_a_newer_observation_of_another_deployment_fails_the_check_naming_the_host() -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["node-1", "node-2"])
        installed(instance, "node-1", A)
        installed(instance, "node-2", A)
        drifted, interrupted, evaluation = record_statuses(instance, [live("node-1", A), live("node-2", B)])
        assert interrupted == {}, "no install run explains it: drift"
        assert drifted == ["node-2"] and not evaluation.passed
        rows = {r.data["host"]: r.data for r in evaluation.metadata["revisions"].value.records}
        assert rows["node-2"]["live_deployment"] == B and rows["node-2"]["installed_deployment"] == A
        [observed] = instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=INSTALLATION, asset_partitions=["node-2"]), limit=1
        ).records
        assert observed.asset_observation is not None
        assert observed.asset_observation.metadata["live_revision"].value == "b" * 40
        result = live_matches_installed(dg.build_asset_check_context(instance=instance))
        assert isinstance(result, dg.AssetCheckResult) and not result.passed
        assert result.description is not None and "node-2" in result.description

        installed(instance, "node-2", B)  # a rollback or install after the observation: no longer drift
        result = live_matches_installed(dg.build_asset_check_context(instance=instance))
        assert isinstance(result, dg.AssetCheckResult) and result.passed
        assert record_statuses(instance, [live("node-2", None)])[0] == ["node-2"], "no current at all is drift"


def test_a_host_moved_by_an_install_killed_before_it_recorded_it_is_an_interrupted_install() -> None:
    """`current` names B, the last recorded install is A, and an install run of B over this host ended failed:
    `status` says interrupted install, not drift (a run of B over another host, or of another deployment,
    explains nothing)."""
    job = dg.define_asset_job("install_job", selection=[dg.AssetKey("host_installation")])
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, ["node-1", "node-2", "node-3"])
        for host_id in ("node-1", "node-2", "node-3"):
            installed(instance, host_id, A)
        for deployment, start, end in ((B, "node-2", "node-2"), (B, "node-3", "node-3"), (A, "node-1", "node-1")):
            run = instance.create_run_for_job(job_def=_job(job), run_config={}, tags={
                "narwhal/deployment_id": deployment, "dagster/asset_partition_range_start": start,
                "dagster/asset_partition_range_end": end})  # fmt: skip
            instance.report_run_failed(run, message="killed")
        drifted, interrupted, _ = record_statuses(instance, [live("node-1", B), live("node-2", B)])
        assert drifted == ["node-1", "node-2"]
        assert list(interrupted) == ["node-2"] and "interrupted install" in interrupted["node-2"]


def _job(job: dg.UnresolvedAssetJobDefinition) -> dg.JobDefinition:
    @dg.asset(name="host_installation", partitions_def=dg.DynamicPartitionsDefinition(name=HOSTS_PARTITIONS_NAME))
    def host_installation() -> None: ...

    return dg.Definitions(assets=[host_installation], jobs=[job]).resolve_job_def("install_job")

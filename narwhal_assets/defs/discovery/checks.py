"""Asset checks: each can fail, with a description naming the file, field or host at fault."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg

from narwhal_assets.core.discovery.digests import compare_replicas
from narwhal_assets.core.discovery.manifest import GENERATED_FILES
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.defs.discovery.assets import CHECKPOINTS, KNOWN_HOSTS, OBSERVATIONS
from narwhal_assets.defs.lineage import upstream_path
from narwhal_assets.defs.resources import ManagementCheckout
from narwhal_assets.local.privatefiles import non_private
from narwhal_assets.ssh.access import host_accesses
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.trust import KnownHostsStore
from narwhal_assets.workflows.discover import DiscoveryRun

# One private-modes check covers every generated asset (`GENERATED_FILES`) with the files it writes.
PRIVATE_CHECK = "files_private"


# Discovery records host keys when `discovered_config` publishes the set, so the check waits for that.
@dg.asset_check(
    asset=KNOWN_HOSTS,
    additional_deps=["profiling_limits"],
    description="Every inventory host has a recorded host key",
)
def known_hosts_cover_inventory(checkout: ManagementCheckout) -> dg.AssetCheckResult:
    opened = checkout.open()
    settings = opened.settings
    store = KnownHostsStore(settings.known_hosts_path)
    missing = []
    for access in host_accesses(settings, opened.inventory.hosts):
        endpoint = resolve_endpoint(access.destination, settings.ssh_config_path)
        if not store.keys_for(*endpoint.known_host):
            missing.append(access.host_id)
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"missing_hosts": missing, "store": str(store.path)},
        description=f"no recorded key for: {', '.join(missing)}" if missing else "all hosts recorded",
    )


@dg.asset_check(asset=CHECKPOINTS, description="Engine replicas serve identical checkpoint trees", blocking=True)
def checkpoint_replicas_agree(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    run = DiscoveryRun.load(upstream_path(context.instance, context.run.run_id, OBSERVATIONS, "run_dir"))
    try:
        compare_replicas(run.checkpoints)
    except InputError as exc:
        return dg.AssetCheckResult(passed=False, description=str(exc), metadata={"run_dir": str(run.run_dir)})
    digests = sorted({d.tree_sha256 for d in run.checkpoints.values()})
    return dg.AssetCheckResult(passed=True, metadata={"run_dir": str(run.run_dir), "tree_digests": digests})


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(PRIVATE_CHECK, asset=key, description="Its files are 0600 and their directories 0700")
        for key in GENERATED_FILES
    ],
    can_subset=True,
)
def generated_files_private(
    context: dg.AssetCheckExecutionContext, checkout: ManagementCheckout
) -> Iterator[dg.AssetCheckResult]:
    settings = Settings.load(checkout.path)
    instance_dir = Path(context.instance.root_directory)
    for check_key in context.selected_asset_check_keys:
        yield private_modes_result(settings, check_key.asset_key, instance_dir)


def private_modes_result(settings: Settings, key: dg.AssetKey, instance_dir: Path | None = None) -> dg.AssetCheckResult:
    """The files of asset `key`; the inventory's check also covers the Dagster instance (it holds the partitions)."""
    paths = GENERATED_FILES[key.to_user_string()](settings)
    if instance_dir is not None and key.to_user_string() == "host_inventory":
        paths = [*paths, instance_dir]
    loose = non_private(paths)
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=PRIVATE_CHECK,
        passed=not loose,
        description="\n".join(loose) if loose else "all private",
        metadata={"checked": [str(p) for p in paths]},
    )

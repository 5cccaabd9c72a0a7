"""`host_inventory`: the physical hosts and their roles, plus the `narwhal_hosts` partitions."""

import dagster as dg

from narwhal_assets.defs.partitions import sync_host_partitions
from narwhal_assets.defs.resources import ManagementCheckout
from narwhal_assets.workflows.discover import check_discovery_inputs, operator_settings

OBSERVATIONS = dg.AssetKey("host_observations")


@dg.asset(group_name="discovery", kinds={"json"})
def host_inventory(context: dg.AssetExecutionContext, checkout: ManagementCheckout) -> dg.MaterializeResult:  # type: ignore[type-arg]  # Dagster reads it: the bare class
    """Validate (or derive from .env) the host inventory and register every host id as a partition.

    In a run that goes on to discover, every input discovery can check without a host is checked first: a
    refused discovery saves no inventory (which would otherwise outlive the fix of the input)."""
    opened = checkout.open()
    if OBSERVATIONS in (context.run.asset_selection or context.job_def.asset_layer.asset_graph.get_all_asset_keys()):
        check_discovery_inputs(operator_settings(opened.settings), opened.inventory)
    digest = opened.save_inventory()
    inventory = opened.inventory
    added, removed = sync_host_partitions(context.instance, inventory.host_ids())
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(opened.settings.hosts_path)),
            "sha256": digest,
            "hosts": dg.MetadataValue.json({h.id: h.roles for h in inventory.hosts}),
            "password_hosts": [h.id for h in inventory.hosts if h.password_env],
            "partitions_added": added,
            "partitions_removed": removed,
        },
        data_version=dg.DataVersion(digest),
    )

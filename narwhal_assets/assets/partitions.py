"""The dynamic partitions of physical hosts, shared by every per-host asset and sensor."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.core.inventory import partition_changes

# Partition names are global to a Dagster instance; every per-host asset partitions by this one definition.
HOSTS_PARTITIONS_NAME = "narwhal_hosts"
host_partitions = dg.DynamicPartitionsDefinition(name=HOSTS_PARTITIONS_NAME)


def sync_host_partitions(instance: dg.DagsterInstance, host_ids: list[str]) -> tuple[list[str], list[str]]:
    """Make `narwhal_hosts` equal to `host_ids` (a removed host's history stays); returns (added, removed)."""
    added, removed = partition_changes(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME), host_ids)
    if added:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, added)
    for host_id in removed:
        instance.delete_dynamic_partition(HOSTS_PARTITIONS_NAME, host_id)
    return added, removed


def partition_requests(current: list[str], host_ids: list[str]) -> list[dg.DynamicPartitionsRequest]:
    """The same change as requests a sensor returns (`SensorResult(dynamic_partitions_requests=...)`)."""
    added, removed = partition_changes(current, host_ids)
    requests: list[dg.DynamicPartitionsRequest] = []
    if added:
        requests.append(host_partitions.build_add_request(added))
    if removed:
        requests.append(host_partitions.build_delete_request(removed))
    return requests

"""The dynamic partitions of physical hosts, shared by every per-host asset and sensor."""

from __future__ import annotations

import dagster as dg

from narwhal_assets.core.discovery.watch import host_diff

# Partition names are global to a Dagster instance; every per-host asset partitions by this one definition.
HOSTS_PARTITIONS_NAME = "narwhal_hosts"
host_partitions = dg.DynamicPartitionsDefinition(name=HOSTS_PARTITIONS_NAME)


def sync_host_partitions(instance: dg.DagsterInstance, host_ids: list[str]) -> tuple[list[str], list[str]]:
    """Make `narwhal_hosts` equal to `host_ids` (a removed host's history stays); returns (added, removed)."""
    diff = host_diff(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME), host_ids)
    if diff.added:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, diff.added)
    for host_id in diff.removed:
        instance.delete_dynamic_partition(HOSTS_PARTITIONS_NAME, host_id)
    return diff.added, diff.removed


def partition_requests(current: list[str], host_ids: list[str]) -> list[dg.DynamicPartitionsRequest]:
    """The same change as the requests a sensor returns (`SensorResult(dynamic_partitions_requests=...)`)."""
    diff = host_diff(current, host_ids)
    requests: list[dg.DynamicPartitionsRequest] = []
    if diff.added:
        requests.append(host_partitions.build_add_request(diff.added))
    if diff.removed:
        requests.append(host_partitions.build_delete_request(diff.removed))
    return requests

"""The dynamic partitions of physical hosts, shared by every per-host asset and sensor."""

from __future__ import annotations

import dagster as dg

# Partition names are global to a Dagster instance; the per-host install asset partitions by this name.
HOSTS_PARTITIONS_NAME = "narwhal_hosts"


def sync_host_partitions(instance: dg.DagsterInstance, host_ids: list[str]) -> tuple[list[str], list[str]]:
    """Make `narwhal_hosts` equal to `host_ids`; returns (added, removed)."""
    current = set(instance.get_dynamic_partitions(HOSTS_PARTITIONS_NAME))
    added = [h for h in host_ids if h not in current]
    removed = sorted(current - set(host_ids))
    if added:
        instance.add_dynamic_partitions(HOSTS_PARTITIONS_NAME, added)
    for host_id in removed:
        instance.delete_dynamic_partition(HOSTS_PARTITIONS_NAME, host_id)
    return added, removed

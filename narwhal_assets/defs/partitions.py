"""The dynamic partitions of physical hosts, shared by every per-host asset and sensor."""

from __future__ import annotations

from collections.abc import Sequence

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


# Dagster's own run tags for a run over a range of partitions (a single-run backfill sets the same).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def partition_span(order: Sequence[str], host_ids: list[str]) -> tuple[dict[str, str], list[str]]:
    """The run tags for one run over `host_ids` (each a partition, `order` the partitions' order), and the
    hosts to name in the run's config: none when they are one contiguous range of the partitions (the whole
    fleet, one host), else exactly them (the range then spans hosts the run leaves alone, observed as such)."""
    positions = sorted(order.index(h) for h in host_ids)
    tags = {RANGE_START_TAG: order[positions[0]], RANGE_END_TAG: order[positions[-1]]}
    contiguous = positions[-1] - positions[0] + 1 == len(positions)
    return tags, [] if contiguous else sorted(host_ids)


def partition_requests(current: Sequence[str], host_ids: list[str]) -> list[dg.DynamicPartitionsRequest]:
    """The same change as the requests a sensor returns (`SensorResult(dynamic_partitions_requests=...)`)."""
    diff = host_diff(current, host_ids)
    requests: list[dg.DynamicPartitionsRequest] = []
    if diff.added:
        requests.append(host_partitions.build_add_request(diff.added))
    if diff.removed:
        requests.append(host_partitions.build_delete_request(diff.removed))
    return requests

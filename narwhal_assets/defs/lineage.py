"""Read an upstream asset's materialization the way lineage means it: the one of this run, if it made one.

Falling back to the latest materialization only when this run did not materialize the upstream keeps a
concurrent run from handing its observations to another run's downstream assets.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from narwhal_assets.core.errors import NarwhalError


def upstream_metadata(
    instance: dg.DagsterInstance, run_id: str, key: dg.AssetKey, command: str = "deploy-hosts discover"
) -> Mapping[str, dg.MetadataValue]:
    """Metadata of `key`'s materialization in run `run_id`, else of its latest one; raises (naming `command`,
    which materializes it) when it has none."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    for record in reversed(records):
        materialization = record.event_log_entry.asset_materialization
        if materialization is not None and materialization.asset_key == key:
            return materialization.metadata
    return latest_metadata(instance, key, command)


def latest_metadata(
    instance: dg.DagsterInstance, key: dg.AssetKey, command: str = "deploy-hosts discover"
) -> Mapping[str, dg.MetadataValue]:
    """Metadata of `key`'s latest materialization (for sensors and runs that did not materialize it)."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        raise NarwhalError(f"{key.to_user_string()} has never been materialized; run `{command}`")
    return event.asset_materialization.metadata


def upstream_path(instance: dg.DagsterInstance, run_id: str, key: dg.AssetKey, name: str) -> Path:
    """A path recorded under `name` in the upstream materialization of this run (else the latest one)."""
    return _path(upstream_metadata(instance, run_id, key), key, name)


def latest_path(instance: dg.DagsterInstance, key: dg.AssetKey, name: str) -> Path:
    """A path recorded under `name` in `key`'s latest materialization."""
    return _path(latest_metadata(instance, key), key, name)


def _path(metadata: Mapping[str, dg.MetadataValue], key: dg.AssetKey, name: str) -> Path:
    if name not in metadata:
        raise NarwhalError(f"{key.to_user_string()}: its materialization records no {name}; run discovery again")
    return Path(str(metadata[name].value))

"""Materialize assets in-process against the operator's Dagster instance, so CLI, UI and CI share lineage."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from narwhal_assets.privatefiles import ensure_private_dir, write_private

DAGSTER_HOME_DEFAULT = "runs/dagster"
INSTANCE_YAML = """\
# Embedded SQLite storage in this directory; README.md shows the PostgreSQL settings for teams.
telemetry:
  enabled: false
"""
# Console output of in-process runs: only the CLI's own lines and errors reach the operator.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def operator_instance(root: Path) -> dg.DagsterInstance:
    """The persistent instance at `DAGSTER_HOME` (default `<root>/runs/dagster`, created 0700)."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(root / DAGSTER_HOME_DEFAULT)))
    if not (home / "dagster.yaml").exists():
        write_private(home / "dagster.yaml", INSTANCE_YAML)
    ensure_private_dir(home)
    return dg.DagsterInstance.get()


def materialize_selection(
    selection: str | Sequence[str] | dg.AssetSelection,
    instance: dg.DagsterInstance,
    root: Path,
    *,
    partition_key: str | None = None,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """Run the named assets of the code location; a domain failure re-raises as its NarwhalError."""
    from narwhal_assets.definitions import ALL_ASSETS, ALL_CHECKS, resources
    from narwhal_assets.resources import NarwhalSettings

    config: dict[str, Any] = {**QUIET, **(run_config or {})}
    # In-process execution re-raises an asset's own exception, so a NarwhalError reaches the CLI as itself.
    return dg.materialize(
        [*ALL_ASSETS, *ALL_CHECKS],
        selection=selection,
        instance=instance,
        resources={**resources(), "narwhal": NarwhalSettings(root=str(root))},
        partition_key=partition_key,
        run_config=config,
        tags=dict(tags or {}),
    )

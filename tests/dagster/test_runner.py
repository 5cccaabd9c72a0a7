"""`runner.run_job` on a real embedded-SQLite instance: the event index it keeps open during a run is closed after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from narwhal_assets.runner import run_job


def test_run_job_closes_the_event_index_it_kept_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NARWHAL_"):
            monkeypatch.delenv(name)
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text("NARWHAL_ROUTER_SSH=ops@gpu-a\nNARWHAL_NODE_1_SSH=ops@gpu-a\n")
    home = tmp_path / "dagster"
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    for _ in range(2):  # a new instance, then an existing one
        result = run_job(root, "discovery_job", "test", assets=["host_inventory"])
        assert result.success
        index = home / "history" / "runs" / "index.db"
        # The last connection to close checkpoints the write-ahead log and deletes it: none is left open.
        assert index.is_file()
        assert not index.with_name("index.db-wal").exists()
        assert len(result.get_asset_materialization_events()) == 1

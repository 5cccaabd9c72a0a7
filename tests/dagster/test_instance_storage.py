"""The instance the project creates keeps one engine, and its open connections, per SQLite database: a run
no longer opens a connection per transaction, stock Dagster reads the same history, and a forked child
opens connections of its own. Real instances on disk, real SQLite."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

from narwhal_assets.runtime import instance_storage
from narwhal_assets.runtime.runner import PREVIOUS_INSTANCE_YAML, instance_yaml, operator_instance


@dg.asset
def upstream() -> int:
    return 1


@dg.asset(check_specs=[dg.AssetCheckSpec("positive", asset="downstream")])
def downstream(upstream: int) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"value": upstream + 1}, check_results=[dg.AssetCheckResult(passed=True)])


JOB = dg.Definitions(assets=[upstream, downstream], jobs=[dg.define_asset_job("small_job")]).resolve_job_def(
    "small_job"
)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "runs" / "dagster"))
    return tmp_path


def connections_opened_by(action: object) -> int:
    opened = []

    def count(*_: object) -> None:
        opened.append(1)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", count)
    try:
        action()  # type: ignore[operator]
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", count)
    return len(opened)


def test_a_run_reuses_the_open_connections_of_its_databases(root: Path) -> None:
    instance = operator_instance(root)
    assert isinstance(instance.run_storage, instance_storage.PooledSqliteRunStorage)
    assert isinstance(instance.event_log_storage, instance_storage.PooledSqliteEventLogStorage)

    def run() -> None:
        assert JOB.execute_in_process(instance=instance).success

    run()  # creates the index database and the pools
    # Only creating the run's own event-log database connects (6 times, in Dagster's schema set-up); Dagster's
    # stock SQLite storage connects once per transaction: 74 times for this run.
    assert connections_opened_by(run) <= 8
    assert any(conn.endswith("/runs.db") for conn in instance_storage.open_databases())


def test_stock_dagster_reads_the_history_the_pooled_storage_wrote(root: Path) -> None:
    instance = operator_instance(root)
    result = JOB.execute_in_process(instance=instance)
    written = [event.dagster_event_type for event in instance.all_logs(result.run_id)]

    stock = DagsterSqliteStorage.from_local(os.environ["DAGSTER_HOME"])
    [run] = stock.run_storage.get_runs()
    assert run.run_id == result.run_id and run.is_success
    assert [event.dagster_event_type for event in stock.event_log_storage.get_logs_for_run(run.run_id)] == written
    assert stock.event_log_storage.get_latest_materialization_events([dg.AssetKey("downstream")])


def test_an_instance_written_by_an_earlier_version_or_for_another_directory_is_switched_but_an_edited_one_is_kept(
    root: Path,
) -> None:
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, mode=0o700)
    config = home / "dagster.yaml"
    for ours in (PREVIOUS_INSTANCE_YAML, instance_yaml(root / "moved-from")):
        config.write_text(ours)
        operator_instance(root)
        assert config.read_text() == instance_yaml(home)

    edited = instance_yaml(root / "elsewhere") + "run_monitoring:\n  enabled: true\n"
    config.write_text(edited)
    operator_instance(root)
    assert config.read_text() == edited


# dagster.yaml exactly as the version before the layout move wrote it
LANDED_BEFORE_THE_MOVE = """\
# Embedded SQLite storage in this directory, connections kept open per process (instance_storage.py);
# README.md shows the PostgreSQL settings for teams. Written by deploy-hosts, which rewrites it if the
# directory moves; edit it and it is left as it is.
storage:
  custom:
    module: narwhal_assets.instance_storage
    class: PooledSqliteStorage
    config:
      base_dir: {base_dir}
telemetry:
  enabled: false
"""


def test_an_instance_written_before_the_layout_move_opens_and_keeps_its_history(root: Path) -> None:
    """Its dagster.yaml names the storage module by its old path (`narwhal_assets.instance_storage`)."""
    home = Path(os.environ["DAGSTER_HOME"])
    instance = operator_instance(root)
    run_id = JOB.execute_in_process(instance=instance).run_id
    instance.dispose()
    config = home / "dagster.yaml"
    config.write_text(LANDED_BEFORE_THE_MOVE.format(base_dir=json.dumps(str(home.resolve()))))

    reopened = operator_instance(root)
    assert config.read_text() == instance_yaml(home)
    assert reopened.get_run_by_id(run_id) is not None
    assert reopened.get_latest_materialization_event(dg.AssetKey("downstream")) is not None


def test_an_instance_opened_by_its_path_uses_its_own_files_whatever_dagster_home_says(root: Path) -> None:
    """Opening one instance by path while DAGSTER_HOME names another (a test harness, a script) must not mix them."""
    operator_instance(root)  # creates the instance at DAGSTER_HOME
    other = root / "other-home"
    other.mkdir(mode=0o700)
    (other / "dagster.yaml").write_text(instance_yaml(other))
    with dg.DagsterInstance.from_config(str(other)) as instance:
        instance.add_dynamic_partitions("hosts", ["node-1"])
    assert (other / "history" / "runs" / "index.db").is_file()
    with dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as instance:
        assert instance.get_dynamic_partitions("hosts") == []
    with dg.DagsterInstance.from_config(str(other)) as instance:
        assert instance.get_dynamic_partitions("hosts") == ["node-1"]


def test_a_forked_child_opens_its_own_connections(root: Path) -> None:
    instance = operator_instance(root)
    assert JOB.execute_in_process(instance=instance).success
    assert instance_storage.open_databases()
    child = os.fork()
    if child == 0:  # the child reports through its exit status only
        inherited = len(instance_storage.open_databases())
        ok = inherited == 0 and len(instance.get_runs()) == 1
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(instance.get_runs()) == 1


def test_connections_beyond_the_kept_ones_open_without_waiting_and_close_when_returned(tmp_path: Path) -> None:
    engine = instance_storage.engine_for(f"sqlite:///{tmp_path / 'busy.db'}")
    with ExitStack() as stack:  # more simultaneous users than any pool cap: a webserver under load
        connections = [stack.enter_context(engine.connect()) for _ in range(24)]
        assert all(conn.exec_driver_sql("select 1").scalar() == 1 for conn in connections)
    assert engine.pool.checkedin() == instance_storage.KEPT_CONNECTIONS  # type: ignore[attr-defined]


def test_a_child_forked_while_another_thread_holds_the_engine_lock_can_still_open_databases(root: Path) -> None:
    instance = operator_instance(root)
    with instance_storage._engines_lock:  # as a webserver thread opening a database at the moment of the fork
        child = os.fork()
        if child == 0:
            os._exit(0 if len(instance.get_runs()) == 0 else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        raise AssertionError("the child waited for a lock that no thread of its own held")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_the_schema_head_is_found_once_per_process_and_the_database_revision_on_every_check(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alembic loads every migration script to find the newest revision; after `load_schema_heads` (what
    `deploy-hosts preload` does before forking) opening an existing instance, as each command does, loads
    none (creating a database still stamps it through alembic, Dagster's own way)."""
    from alembic.script import ScriptDirectory

    assert JOB.execute_in_process(instance=operator_instance(root)).success  # the databases exist now
    instance_storage.load_schema_heads()
    loads = []
    from_config = ScriptDirectory.from_config

    def counted(config: object) -> ScriptDirectory:
        loads.append(config)
        return from_config(config)  # type: ignore[arg-type]

    monkeypatch.setattr(ScriptDirectory, "from_config", counted)
    instance = operator_instance(root)
    assert len(instance.get_runs()) == 1
    assert loads == []
    db_revision, head = instance.run_storage.alembic_version()  # type: ignore[attr-defined]
    assert db_revision == head is not None  # read from the database: stamped at the newest revision

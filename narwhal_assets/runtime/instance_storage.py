"""Dagster's embedded SQLite storage, with each database's connections kept open for the life of a process.

Dagster's SQLite storages build a new SQLAlchemy engine, and so open a new connection, for every
transaction: one discovery run opened and closed about 550. A new engine compiles every statement again,
and closing the last connection to a WAL database checkpoints it (an fsync). Keeping one engine and its
connection pool per database file halves the CPU a run spends in Dagster (`benchmarks/bench_cli.py`). The
files, schema and locking are Dagster's own, so a stock instance reads the same directory, and processes
share it as before: SQLite serialises their writers with its file locks and busy timeout.

Each storage also asks alembic for the newest schema revision when it opens, and alembic finds it by loading
every migration script (about 90 files, 0.09 CPU-s, four times per instance). That revision is fixed by the
installed Dagster, so it is computed once per process (`schema_head`; `deploy-hosts preload` computes it
before forking its commands); the database's own revision is still read on every check.

`runner.instance_yaml` selects this storage for the instance the project creates. This is the one module
that uses Dagster's private storage API (`dagster._core.storage`): Dagster offers no public way to share an
engine between transactions or to check a schema once. The exact Dagster pin in `constraints.txt` keeps it in
step.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster._core.storage import sql as dagster_sql
from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite import sqlite_run_storage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite import sqlite_schedule_storage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

# Databases whose engines stay open: the run, schedule and event index databases, and the per-run event logs
# of the runs a process is working on (a long-lived webserver reads many runs; older ones close again).
OPEN_DATABASES = 16
KEPT_CONNECTIONS = 4  # per database: a run's thread, the event watcher, a webserver's concurrent requests

_engines: OrderedDict[str, Engine] = OrderedDict()
_engines_lock = threading.Lock()


def engine_for(conn_string: str) -> Engine:
    """The process's engine for one database file, created on first use (least recently used one disposed)."""
    with _engines_lock:
        engine = _engines.pop(conn_string, None)
        if engine is None:
            engine = sqlalchemy.create_engine(
                conn_string,
                poolclass=QueuePool,
                pool_size=KEPT_CONNECTIONS,
                max_overflow=-1,  # no cap, as in Dagster's storage: connections beyond the kept ones close
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            )
        _engines[conn_string] = engine
        while len(_engines) > OPEN_DATABASES:
            _engines.popitem(last=False)[1].dispose()  # connections checked out now close when returned
        return engine


def open_databases() -> list[str]:
    """Connection strings of the databases this process keeps open, least recently used first."""
    with _engines_lock:
        return list(_engines)


def close_databases() -> None:
    """Close every kept connection; the next use opens them again. Closing the last connection to a WAL
    database checkpoints it and removes its -wal and -shm files, as Dagster's stock storage leaves the
    directory after each transaction: done at exit, and by worker processes (which leave by `os._exit`)."""
    with _engines_lock:
        _forget_engines(close=True)


def _forget_engines(close: bool) -> None:
    for engine in _engines.values():
        engine.dispose(close=close)
    _engines.clear()


def _start_afresh_in_child() -> None:
    """A forked child must not share its parent's SQLite connections (it opens its own on first use), and
    gets a new lock: another thread of the parent may have held it at the fork, and nobody would release it."""
    global _engines_lock
    _engines_lock = threading.Lock()
    _forget_engines(close=False)


os.register_at_fork(after_in_child=_start_afresh_in_child)
atexit.register(close_databases)

CHECKING_MODULES = (sqlite_run_storage, sqlite_schedule_storage, sqlite_event_log)  # each checks its schema


@functools.cache
def schema_head(alembic_config: Config) -> str | tuple[str, ...] | None:
    """The newest revision of the migrations `alembic_config` names (Dagster keeps one config per storage)."""
    return ScriptDirectory.from_config(alembic_config).as_revision_number("head")


def _check_alembic_revision(alembic_config: Config, conn: Connection) -> dagster_sql.AlembicVersion:
    """Dagster's `check_alembic_revision` (the database's revision, the migrations' newest), the newest once."""
    with dagster_sql._alembic_lock:  # as Dagster's: one thread at a time reads or stamps a revision
        db_revision = MigrationContext.configure(conn).get_current_revision()
    return db_revision, schema_head(alembic_config)


def load_schema_heads() -> None:
    """Compute every storage's newest revision now (a process that forks commands, before it forks)."""
    for module in CHECKING_MODULES:
        schema_head(dagster_sql.get_alembic_config(module.__file__))


for _module in CHECKING_MODULES:
    _module.check_alembic_revision = _check_alembic_revision  # type: ignore[attr-defined]


@contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn, conn.begin():
        yield conn


class PooledSqliteRunStorage(SqliteRunStorage):
    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with _transaction(engine_for(self._conn_string)) as conn:
            yield conn


class PooledSqliteScheduleStorage(SqliteScheduleStorage):
    @contextmanager
    def connect(self) -> Iterator[Connection]:
        with _transaction(engine_for(self._conn_string)) as conn:
            yield conn


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = engine_for(self.conn_string_for_shard(shard))
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with _transaction(engine) as conn:
                yield conn


class PooledSqliteStorage(DagsterSqliteStorage):
    """`storage: custom:` in dagster.yaml, with `base_dir` as for Dagster's `storage: sqlite:`."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        # Dagster's own __init__ would open its three storages first; only the base class's is wanted.
        DagsterStorage.__init__(self)  # type: ignore[no-untyped-call, arg-type]  # Dagster's untyped base
        self.base_dir = base_dir
        self._inst_data = inst_data
        self._run_storage = PooledSqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = PooledSqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = PooledSqliteScheduleStorage.from_local(_schedule_directory(base_dir))

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: dict[str, str]) -> PooledSqliteStorage:  # type: ignore[override]
        return cls.from_local(inst_data=inst_data, **config_value)

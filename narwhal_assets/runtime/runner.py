"""Run a named job of the code location in-process against the operator's Dagster instance.

CLI, UI and CI share lineage because they run the same jobs on the same instance; every CLI run is tagged
with the command that started it. The job runs in a worker thread so that SIGINT/SIGTERM reach this
module's handler at once (Dagster defers signals it captures on the main thread until a step boundary):
the run ends within seconds whatever it is doing, except that a config-set publish already under way is
let finish (it takes milliseconds), so the operator is told exactly whether a new set was published.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from narwhal_assets.core.errors import NarwhalError, StorageError
from narwhal_assets.defs.names import COMMAND_TAG
from narwhal_assets.local import collector, configset
from narwhal_assets.local.privatefiles import ensure_private_dir, exclusive_lock, write_private

if TYPE_CHECKING:  # Dagster loads when a job runs or the instance opens, not for `instance_home` (`deploy-hosts ui`)
    import dagster as dg

    from narwhal_assets.workflows.rollout import Progress

DAGSTER_HOME_DEFAULT = "runs/dagster"
# Dagster's `storage: custom:` takes its directory from its config alone, so the instance's own directory is
# written in (quoted as JSON, which YAML reads): `{env: DAGSTER_HOME}` would follow whichever DAGSTER_HOME a
# process has, even one opening this instance by its path.
_STORAGE = """\
# Embedded SQLite storage in this directory, connections kept open per process (instance_storage.py);
# README.md shows the PostgreSQL settings for teams. Written by deploy-hosts, which rewrites it if the
# directory moves; edit it and it is left as it is.
storage:
  custom:
    module: narwhal_assets.runtime.instance_storage
    class: PooledSqliteStorage
    config:
      base_dir: {base_dir}
"""
# No per-step stdout/stderr capture: the ops log through Dagster's event log, and capture started a `tail` and a
# Python watcher process per step (CPU per run, and a Ctrl-C to the command's process group made the watcher
# print a KeyboardInterrupt traceback).
_COMPUTE_LOGS = """\
compute_logs:
  module: dagster._core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
"""
_TELEMETRY = """\
telemetry:
  enabled: false
"""
# The daemon (`deploy-hosts ui`) ends a run whose worker process died (killed, out of memory) as failed, and
# any run past a day; `deploy-hosts` ends its own killed runs itself (`end_dead_runs`).
_RUN_MONITORING = """\
run_monitoring:
  enabled: true
  start_timeout_seconds: 180
  max_runtime_seconds: 86400
"""
INSTANCE_YAML = _STORAGE + _COMPUTE_LOGS + _RUN_MONITORING + _TELEMETRY
# What earlier versions wrote; an instance still holding it exactly is switched to INSTANCE_YAML.
PREVIOUS_INSTANCE_YAML = """\
# Embedded SQLite storage in this directory; README.md shows the PostgreSQL settings for teams.
telemetry:
  enabled: false
"""
# Earlier versions wrote these too (the storage module by its old path, no compute_logs): ours, rewritten.
_STORAGE_MODULES = ("narwhal_assets.runtime.instance_storage", "narwhal_assets.instance_storage")
_TEMPLATES = [INSTANCE_YAML, _STORAGE + _COMPUTE_LOGS + _TELEMETRY,
              *((_STORAGE + _TELEMETRY).replace(_STORAGE_MODULES[0], name) for name in _STORAGE_MODULES)]
_GENERATED = [re.compile(re.escape(text).replace(re.escape("{base_dir}"), '"[^\n]*"')) for text in _TEMPLATES]


def instance_yaml(home: Path) -> str:
    """The dagster.yaml of the instance the project creates in `home`."""
    return INSTANCE_YAML.format(base_dir=json.dumps(str(home.resolve())))


def _is_ours(text: str) -> bool:
    """A dagster.yaml this project wrote and nobody edited (for this directory or another)."""
    return text == PREVIOUS_INSTANCE_YAML or any(pattern.fullmatch(text) for pattern in _GENERATED)


# Console output of in-process runs: only the CLI's own lines and errors reach the operator.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
EXIT_SIGNAL_BASE = 128


def operator_instance(root: Path) -> dg.DagsterInstance:
    """The persistent instance at `DAGSTER_HOME` (default `<root>/runs/dagster`, created 0700).

    Opening it is serialised between processes: two commands started at once on a new instance would
    otherwise both create its SQLite tables and one would fail.
    """
    import dagster as dg

    with _instance_home_locked(root):
        instance = dg.DagsterInstance.get()
    collector.loaded()  # the last of the heavy imports is in
    return instance


def instance_home(root: Path) -> Path:
    """`DAGSTER_HOME` (set to `<root>/runs/dagster` when unset), created 0700 with its dagster.yaml written or
    rewritten as `operator_instance` does; for processes that open the instance themselves (`deploy-hosts ui`)."""
    with _instance_home_locked(root) as home:
        pass
    collector.loaded()  # a process that supervises others (the UI's) runs long: collect as usual
    return home


@contextmanager
def _instance_home_locked(root: Path) -> Iterator[Path]:
    """The instance directory with a current dagster.yaml, under the lock that serialises opening it."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(root / DAGSTER_HOME_DEFAULT)))
    ensure_private_dir(home)
    with exclusive_lock(home / ".narwhal-open.lock"):
        config, wanted = home / "dagster.yaml", instance_yaml(home)
        current = config.read_text(encoding="utf-8") if config.exists() else None
        if current is None or (current != wanted and _is_ours(current)):
            write_private(config, wanted)
        yield home


def run_job(
    root: Path,
    job_name: str,
    command: str,
    *,
    run_config: Mapping[str, Any] | None = None,
    partition_key: str | None = None,
    tags: Mapping[str, str] | None = None,
    assets: Sequence[str] | None = None,
    progress: Progress | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.ExecuteInProcessResult:
    """Execute `job_name` (or only its `assets`) of the definitions bound to `root`; a domain failure
    re-raises as its NarwhalError. `progress`: the fleet operation's, shared with the run (an interrupt
    cancels its host work, waits for what is under way to be recorded, and says where each host stopped).
    `instance`: the operator's, when the command has opened it already (opening it again costs ~0.25 CPU-s)."""
    import dagster as dg

    from narwhal_assets.definitions import make_definitions
    from narwhal_assets.runtime.run_liveness import end_dead_runs, process_tags

    job = make_definitions(str(root), progress).resolve_job_def(job_name)
    try:
        instance = instance if instance is not None else operator_instance(root)
        end_dead_runs(instance)
    except Exception as exc:  # a full disk, a database that is down: say so in one line
        raise StorageError(
            f"the Dagster instance at {os.environ['DAGSTER_HOME']} could not be opened: {type(exc).__name__}: "
            f"{_first_line(str(exc))}; nothing was run, nothing was published"
        ) from None
    config: dict[str, Any] = {**QUIET, **(run_config or {})}
    all_tags = {COMMAND_TAG: command, **process_tags(), **(tags or {})}
    outcome: Future[dg.ExecuteInProcessResult] = Future()
    published_before = len(configset.PUBLISHED)
    run_id = make_run_id()

    def execute() -> None:
        try:
            outcome.set_result(
                job.execute_in_process(
                    run_config=config,
                    instance=instance,
                    partition_key=partition_key,
                    tags=all_tags,
                    run_id=run_id,
                    asset_selection=[dg.AssetKey(name) for name in assets] if assets else None,
                )
            )
        except BaseException as exc:  # handed to the main thread as it is
            outcome.set_exception(exc)

    worker = threading.Thread(target=execute, name=f"narwhal-{job_name}", daemon=True)
    ending = _RunEnding(instance, run_id, progress)
    with _TerminateOnSignals(command, ending), _without_dagster_storage_lines():
        worker.start()
        while not outcome.done():
            worker.join(timeout=0.2)
    try:
        return outcome.result()
    except NarwhalError:
        raise
    except Exception as exc:
        published = configset.PUBLISHED[published_before:]
        what = f"the config set of {published[-1]} was published" if published else "nothing was published"
        failed = _run_failure(exc)  # the run's own failure (hosts, input), which storage could not record
        raise StorageError(
            (f"{failed}\n" if failed else "")
            + f"{job_name} stopped: {type(exc).__name__}: {_first_line(str(exc))}; {what}"
            + ("; recording it in Dagster storage failed, so its lineage is incomplete" if published else "")
        ) from None


class _RunEnding:
    """What an interrupt does before the process exits: cancel the fleet operation's host work and wait (at
    most GRACE_S) until what was under way is recorded, then record the run as canceled."""

    GRACE_S = 12.0

    def __init__(self, instance: dg.DagsterInstance, run_id: str, progress: Progress | None) -> None:
        self.instance, self.run_id, self.progress = instance, run_id, progress

    def lines(self) -> list[str]:
        """Where the fleet operation stood, one line per host."""
        if self.progress is None:
            return []
        self.progress.cancel.set()
        self.progress.recorded.wait(self.GRACE_S)
        return self.progress.lines()

    def cancel(self, signal_name: str) -> None:
        try:
            run = self.instance.get_run_by_id(self.run_id)
            if run is not None and not run.is_finished:
                self.instance.report_run_canceled(run, message=f"deploy-hosts was interrupted by {signal_name}")
        except Exception:  # noqa: S110 (the storage failed too: the next command ends the run, end_dead_runs)
            pass


class _TerminateOnSignals:
    """SIGINT/SIGTERM: one line, exit 130/143, sockets closed by the exit; a publish under way finishes first,
    host work under way is recorded, and the run is recorded as canceled."""

    def __init__(self, command: str, ending: _RunEnding) -> None:
        self.command = command
        self.ending = ending
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; a caller's thread keeps its process's own
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, self._handle)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        for number in self.previous:  # a second Ctrl-C while this waits must not start another wait
            signal.signal(number, signal.SIG_IGN)
        with configset.PUBLISHING:  # waits only while a publish is replacing files
            published = bool(configset.PUBLISHED)
            name = signal.Signals(signum).name
            state = "a new config set had been published" if published else "nothing was published"
            lines = self.ending.lines()
            self.ending.cancel(name)
            for line in lines:
                sys.stderr.write(f"deploy-hosts {self.command}: {line}\n")
            sys.stderr.write(f"deploy-hosts {self.command}: interrupted by {name}; {state}\n")
            sys.stderr.flush()
            os._exit(EXIT_SIGNAL_BASE + signum)


# Dagster writes this to stderr itself when storing an event fails, then raises; StorageError says it once.
DAGSTER_STORAGE_LINE = "Exception while writing logger call to event log: "


class _DropDagsterStorageLines:
    """sys.stderr during a run, without Dagster's own report of a failed event write (a multi-line message
    from SQLAlchemy); everything else passes through."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return len(text) if text.startswith(DAGSTER_STORAGE_LINE) else self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def _without_dagster_storage_lines() -> Iterator[None]:
    previous = sys.stderr
    sys.stderr = _DropDagsterStorageLines(previous)
    try:
        yield
    finally:
        sys.stderr = previous


def _run_failure(exc: BaseException) -> NarwhalError | None:
    """The NarwhalError that `exc` was raised while handling, if any (e.g. a host failure being recorded)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, NarwhalError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def make_run_id() -> str:
    """A run id chosen before the run starts, so an interrupt can record that run's end."""
    import uuid

    return str(uuid.uuid4())


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "(no message)")[:200]

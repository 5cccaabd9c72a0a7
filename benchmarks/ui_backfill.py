"""The UI's install, measured: a backfill of `host_installation` over every host's partition, launched as the
UI's Launch backfill button does (the webserver's GraphQL `launchPartitionBackfill` with the asset and all
partition names), through `deploy-hosts ui` (Dagster's webserver and daemon; the daemon launches the runs).

Everything `deploy-hosts ui` starts runs in one cgroup (process_meter.started): webserver, daemon, code
server, run workers. The backfill's CPU is that cgroup's CPU from the launch until the backfill and every
run it made are done, less what the idle UI spends over the same time (its rate measured just before), and
its Dagster storage is what the instance directory grew by (its `ui.log`, Dagster's console, apart).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from process_meter import Cgroup, quiesce, started

LAUNCH = """mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on Error { message }
  }
}"""
PARTITIONS = """query Partitions {
  assetNodeOrError(assetKey: {path: ["host_installation"]}) { __typename ... on AssetNode { partitionKeys } }
}"""
PROGRESS = """query Progress($id: String!, $filter: RunsFilter!) {
  partitionBackfillOrError(backfillId: $id) { __typename ... on PartitionBackfill { status } ... on Error { message } }
  runsOrError(filter: $filter) { __typename ... on Runs { results { status } } }
}"""
BACKFILL_RUNNING = {"REQUESTED", "CANCELING", "COMPLETING", "FAILING"}
BACKFILL_SUCCEEDED = {"COMPLETED", "COMPLETED_SUCCESS"}
RUN_DONE = {"SUCCESS", "FAILURE", "CANCELED"}
READY_S, IDLE_S, BACKFILL_S = 300.0, 10.0, 3600.0


@dataclass
class Backfill:
    wall: float
    cpu: float  # the backfill's, idle UI's rate taken out
    storage: int  # bytes the instance directory grew by, ui.log apart
    runs: int


def measure_backfill(root: Path, env: dict[str, str]) -> Backfill:
    """One backfill of `host_installation` over all its partitions (the inventory's hosts) on the checkout's
    instance."""
    port = _free_port()
    home = Path(env["DAGSTER_HOME"])
    log = root.parent / f"{root.name}-ui.log"
    argv = [sys.executable, "-m", "narwhal_assets", "--root", str(root), "ui", "--port", str(port)]
    with started(argv, log=log, env=env, cwd=root) as (proc, group):
        url = f"http://127.0.0.1:{port}"
        _wait_serving(url, proc, log)
        quiesce()
        idle_rate = _cpu_rate(group, IDLE_S)
        hosts = _graphql(url, PARTITIONS, {})["assetNodeOrError"]["partitionKeys"]  # type: ignore[index]
        before, began, cpu_before = _storage(home), time.monotonic(), group.cpu_seconds()
        answer = _graphql(url, LAUNCH, {"params": {"assetSelection": [{"path": ["host_installation"]}],
                                                   "partitionNames": hosts, "fromFailure": False}})  # fmt: skip
        launched = answer["launchPartitionBackfill"]
        if launched["__typename"] != "LaunchBackfillSuccess":
            raise SystemExit(f"the backfill was not launched: {launched}")
        runs = _wait_done(url, launched["backfillId"], log)
        wall, cpu = time.monotonic() - began, group.cpu_seconds() - cpu_before
    return Backfill(wall, cpu - idle_rate * wall, _storage(home) - before, runs)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _graphql(url: str, query: str, variables: dict[str, object]) -> dict[str, object]:
    payload = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(f"{url}/graphql", data=payload, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
    if body.get("errors"):
        raise SystemExit(f"GraphQL errors: {body['errors']}")
    return body["data"]  # type: ignore[no-any-return]


def _wait_serving(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"deploy-hosts ui exited; {log}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"deploy-hosts ui did not serve {url} in {READY_S:.0f} s; {log}:\n{_tail(log)}")


def _wait_done(url: str, backfill: str, log: Path) -> int:
    """Poll until the backfill and all its runs are done; the number of runs."""
    deadline = time.monotonic() + BACKFILL_S
    run_filter = {"tags": [{"key": "dagster/backfill", "value": backfill}]}
    while time.monotonic() < deadline:
        data = _graphql(url, PROGRESS, {"id": backfill, "filter": run_filter})
        status = data["partitionBackfillOrError"].get("status")  # type: ignore[union-attr]
        runs = [r["status"] for r in data["runsOrError"].get("results", [])]  # type: ignore[union-attr]
        if status not in BACKFILL_RUNNING and all(r in RUN_DONE for r in runs):
            if status not in BACKFILL_SUCCEEDED or any(r != "SUCCESS" for r in runs):
                raise SystemExit(f"backfill {backfill} ended {status}, runs {runs}; {log}:\n{_tail(log)}")
            return len(runs)
        time.sleep(1)
    raise SystemExit(f"backfill {backfill} not done in {BACKFILL_S:.0f} s; {log}:\n{_tail(log)}")


def _cpu_rate(group: Cgroup, seconds: float) -> float:
    first, began = group.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (group.cpu_seconds() - first) / (time.monotonic() - began)


def _storage(home: Path) -> int:
    total = 0
    for directory, _, names in os.walk(home):
        for name in names:
            if name != "ui.log":
                try:
                    total += Path(directory, name).lstat().st_size
                except FileNotFoundError:
                    continue
    return total


def _tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""

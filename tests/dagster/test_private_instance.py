"""Dagster's own files (SQLite storage, compute logs) are private: every process the project starts runs with
umask 077. Real subprocesses under an operator's usual umask 022, a real instance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal_assets.local.privatefiles import non_private

DAGSTER = Path(sys.executable).parent / "dagster"
needs_cli = pytest.mark.skipif(not DAGSTER.exists(), reason="the dagster CLI is not installed beside python")


def run_with_umask_022(argv: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(home)
    return subprocess.run(
        ["sh", "-c", 'umask 022 && exec "$@"', "sh", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def stored_files(home: Path) -> set[str]:
    return {str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()}


@needs_cli
def test_plan_then_dagster_materialize_leave_only_private_files(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".env").write_text("NARWHAL_NODE_1_SSH=ops@gpu-a\nNARWHAL_NODE_2_SSH=ops@gpu-b\n")
    home = checkout / "runs" / "dagster"

    # `discover` records its run (here one that fails on bad input before any connection: a role nobody owns).
    config = checkout / "config"
    config.mkdir(mode=0o700)
    (config / "hosts.local.json").write_text(
        '{"hosts": [{"id": "node-1", "ssh_env": "NARWHAL_NODE_1_SSH", "roles": ["router", "engine-1"]}]}'
    )
    (config / "hosts.local.json").chmod(0o600)
    done = run_with_umask_022([sys.executable, "-m", "narwhal_assets", "discover"], checkout, home)
    assert done.returncode == 2, done.stderr
    assert "no host owns role 'engine-2'" in done.stderr
    assert not home.exists(), "an input error opens no instance and writes nothing (the README's promise)"
    assert non_private([checkout / "config"]) == []
    (config / "hosts.local.json").unlink()
    done = run_with_umask_022([sys.executable, "-m", "narwhal_assets", "plan"], checkout, home)
    assert done.returncode == 0, done.stderr
    # Dagster's CLI needs the instance to exist: opened as deploy-hosts opens it, after the code location loads
    opened = run_with_umask_022([sys.executable, "-c", "import pathlib, sys, narwhal_assets.definitions as d; "
                                 "d.defs(); from narwhal_assets.runtime.runner import operator_instance; "
                                 "operator_instance(pathlib.Path(sys.argv[1]))", str(checkout)], checkout, home)
    assert opened.returncode == 0, opened.stderr
    after_plan = stored_files(home)

    # Dagster's own CLI against the same instance: the code location sets the umask when Dagster loads it.
    done = run_with_umask_022(
        [str(DAGSTER), "asset", "materialize", "-m", "narwhal_assets.definitions", "--select", "host_inventory"],
        checkout,
        home,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert stored_files(home) > after_plan  # a second run's event log and compute logs
    assert non_private([home, checkout / "config"]) == []

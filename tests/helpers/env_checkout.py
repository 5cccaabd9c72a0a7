"""A checkout holding only a `.env` (two unreachable node destinations and the lines a test adds), and
`deploy-hosts` run on it as its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def write_checkout(root: Path, *lines: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    env = ["NARWHAL_NODE_1_SSH=u@[127.0.0.1]:1", "NARWHAL_NODE_2_SSH=u@[127.0.0.1]:1", *lines]
    (root / ".env").write_text("\n".join(env) + "\n", encoding="utf-8")
    return root


def run_cli(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`deploy-hosts` as its own process (as an operator runs it), DAGSTER_HOME inside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env["DAGSTER_HOME"] = str(root / "runs" / "dagster")
    argv = [sys.executable, "-m", "narwhal_assets", "--root", str(root), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)

"""Management checkouts as real git repositories (`prepare` bundles one of their commits)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

TRACKED = {".gitignore": "/.env\n/config/*.json\n/config/*.env\n/config/ssh.known_hosts*\n/runs/\n",
           ".env.example": "NARWHAL_NODE_1_SSH=ops@gpu-a.example\n", "README.md": "# checkout under test\n",
           "app/main.py": "print('served')\n"}  # fmt: skip


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    return subprocess.run(["git", "-C", str(root), *args], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def git_checkout(root: Path) -> str:
    """Make `root` a git repository with one commit of TRACKED; returns the commit id."""
    git(root, "init", "-q", "-b", "main")
    for name, text in TRACKED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", *TRACKED)
    git(root, "commit", "-q", "-m", "checkout")
    return git(root, "rev-parse", "HEAD")

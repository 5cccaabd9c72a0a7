"""The committed examples are real: `.env.example` parses, and the inventory derived from it is exactly
`config/hosts.example.json` (router and engine-1 on one machine, engine-2 on another, as README describes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from narwhal_assets.core.discovery.manifest import generated_paths
from narwhal_assets.core.inputs.inventory import load_inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout

REPO = Path(__file__).resolve().parents[2]


def test_env_example_derives_the_example_inventory(tmp_path: Path) -> None:
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    checkout = Checkout.from_settings(Settings.load(tmp_path, environ={}))
    example = load_inventory(REPO / "config" / "hosts.example.json")
    assert checkout.inventory == example
    assert [h.roles for h in example.hosts] == [["router", "engine-1"], ["engine-2"]]


def test_the_example_inventory_validates_when_saved(tmp_path: Path) -> None:
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config" / "hosts.example.json", tmp_path / "config" / "hosts.local.json")
    checkout = Checkout.from_settings(Settings.load(tmp_path, environ={}))
    assert checkout.inventory_saved and checkout.inventory.host_ids() == ["node-1", "node-2"]


def test_every_generated_private_file_is_git_ignored(tmp_path: Path) -> None:
    """`prepare` refuses a revision holding any of them, so `git add .` must never pick one up."""
    settings = Settings.load(tmp_path, environ={})
    generated = [path.relative_to(tmp_path) for path in generated_paths(settings)]
    generated += [Path("config/engine-launch.engine-1.json"), Path("config/ssh.known_hosts.lock"),
                  Path("runs/deployment-env/x/manifest.json"), Path("runs/deployment/fleet.json")]
    names = [str(path) for path in generated]
    done = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *names], cwd=REPO,
                          capture_output=True, text=True, check=False)
    not_ignored = [line.split("\t", 1)[1] for line in done.stdout.splitlines() if line.startswith("::")]
    assert "config/profiling-limits.json" in names
    assert not_ignored == []

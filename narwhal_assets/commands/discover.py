"""`deploy-hosts discover`: materialize the discovery group and summarize what it generated."""

from __future__ import annotations

import argparse
from pathlib import Path

import dagster as dg

from narwhal_assets.assets.discovery import OBSERVATIONS
from narwhal_assets.definitions import DISCOVERY
from narwhal_assets.discovery import DiscoveryRun
from narwhal_assets.runner import materialize_selection, operator_instance


def run(args: argparse.Namespace) -> int:
    config = {"ops": {"host_discovery": {"config": {"full_hash": bool(args.full_hash)}}}}
    result = materialize_selection(DISCOVERY, operator_instance(args.root), args.root, run_config=config)
    latest = DiscoveryRun.load(_run_dir(result))
    print(f"discovery run {latest.run_dir}")
    for host_id, obs in sorted(latest.observations.items()):
        gpus = f"{len(obs.gpus)}x {obs.gpus[0].name}" if obs.gpus else "no GPUs"
        print(f"  {host_id:<10} roles={','.join(obs.roles):<20} hostname={obs.hostname} (label) {gpus}")
    for engine, digest in sorted(latest.checkpoints.items()):
        print(
            f"  {engine:<10} tree sha256 {digest.tree_sha256} ({len(digest.files)} files, "
            f"{digest.bytes_hashed} bytes hashed, {digest.files_reused} files reused)"
        )
    print(f"generated files are listed with their SHA-256 in {latest.run_dir / 'manifest.json'}")
    return 0


def _run_dir(result: dg.ExecuteInProcessResult) -> Path:
    """The run directory this materialization wrote (not the newest by name: names sort only by second)."""
    for materialization in result.asset_materializations_for_node("host_discovery"):
        if materialization.asset_key == OBSERVATIONS:
            return Path(str(materialization.metadata["run_dir"].value))
    raise AssertionError("a successful discovery materializes host_observations")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("discover", help="inspect every host and regenerate the discovered config set")
    parser.add_argument("--full-hash", action="store_true", help="re-hash every checkpoint file")
    parser.set_defaults(func=run)

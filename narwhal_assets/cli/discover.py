"""`deploy-hosts discover`: run `discovery_job` and summarize what it generated."""

from __future__ import annotations

import argparse
from pathlib import Path

from narwhal_assets.defs.names import DISCOVERY_JOB

COMMAND = "discover"


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.workflows.discover import check_discovery_inputs, operator_settings

    checkout = Checkout.open(args.root)  # bad input (no .env, a broken inventory): exit 2 before any run or file
    check_discovery_inputs(operator_settings(checkout.settings), checkout.inventory)
    from narwhal_assets.core.display import printable
    from narwhal_assets.defs.discovery.assets import OBSERVATIONS
    from narwhal_assets.runtime.runner import run_job
    from narwhal_assets.workflows.discover import DiscoveryRun

    config = {"ops": {"host_discovery": {"config": {"full_hash": bool(args.full_hash)}}}}
    result = run_job(args.root, DISCOVERY_JOB, COMMAND, run_config=config)
    (materialization,) = [m for m in result.asset_materializations_for_node("host_discovery")
                          if m.asset_key == OBSERVATIONS]  # fmt: skip
    latest = DiscoveryRun.load(Path(str(materialization.metadata["run_dir"].value)))
    print(f"discovery run {latest.run_dir}")
    for host_id, obs in sorted(latest.observations.items()):
        gpus = f"{len(obs.gpus)}x {printable(obs.gpus[0].name)}" if obs.gpus else "no GPUs"
        print(f"  {host_id:<10} roles={','.join(obs.roles):<20} hostname={printable(obs.hostname)} (label) {gpus}")
    for engine, digest in sorted(latest.checkpoints.items()):
        print(
            f"  {engine:<10} tree sha256 {digest.tree_sha256} ({len(digest.files)} files, "
            f"{digest.bytes_hashed} bytes hashed, {digest.files_reused} files reused)"
        )
    print(f"generated files are listed with their SHA-256 in {latest.run_dir / 'manifest.json'}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_text = "inspect every host and regenerate the discovered config set (the discovery_job)"
    parser = sub.add_parser(COMMAND, help=help_text, description=help_text)
    parser.add_argument("--full-hash", action="store_true", help="re-hash every checkpoint file")
    parser.set_defaults(func=run)

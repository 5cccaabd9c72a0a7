"""`deploy-hosts prepare [--out DIR]`: materialize the `prepare` group and say where it went."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal_assets.defs.names import PREPARE_JOB

if TYPE_CHECKING:
    import dagster as dg

EXIT_FAILED = 1
COMMAND = "prepare"


def run(args: argparse.Namespace) -> int:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.workflows.prepare import check_inputs

    out = str(Path(args.out).resolve()) if args.out else ""
    check_inputs(Checkout.open(args.root).settings, out or None)  # bad input: exit 2 before any run or file
    from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST
    from narwhal_assets.defs.prepare.assets import OP_NAME, ROLE_ENVIRONMENTS
    from narwhal_assets.runtime.runner import run_job

    config = {"ops": {OP_NAME: {"config": {"out": out}}}}
    result = run_job(args.root, PREPARE_JOB, COMMAND, run_config=config)
    meta = _metadata(result)
    manifest = meta[DEPLOYMENT_MANIFEST]
    print(f"prepared deployment {manifest['deployment_id']} of revision {manifest['revision']}")
    for host_id, files in sorted(meta[ROLE_ENVIRONMENTS]["sha256"].items()):
        print(f"  {host_id:<10} {len(files)} files: {', '.join(Path(p).name for p in files)}")
    evaluations = result.get_asset_check_evaluations()
    failed = [e for e in evaluations if not e.passed]
    print(f"asset checks: {len(evaluations) - len(failed)} passed, {len(failed)} failed")
    for evaluation in failed:
        for line in (evaluation.description or "failed").splitlines():
            print(f"deploy-hosts prepare: check {evaluation.check_name} failed: {line}", file=sys.stderr)
    print(f"manifest {manifest['path']} (remote directory ~/{manifest['remote_dir']})")
    print(f"output directory {manifest['out']}")
    return EXIT_FAILED if failed else 0


def _metadata(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dict[str, Any]]:
    from narwhal_assets.defs.prepare.assets import OP_NAME

    return {
        m.asset_key: {key: value.value for key, value in m.metadata.items()}
        for m in result.asset_materializations_for_node(OP_NAME)
    }


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_text = "write one verified prepared run from the discovered config set (the prepare_job)"
    parser = sub.add_parser(COMMAND, help=help_text, description=help_text)
    parser.add_argument("--out", metavar="DIR", help="a new directory (default: new under runs/deployment-env/)")
    parser.set_defaults(func=run)

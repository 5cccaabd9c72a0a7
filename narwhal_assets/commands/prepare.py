"""`deploy-hosts prepare [--out DIR]`: materialize the `deployment` group and say where it went."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import dagster as dg

from narwhal_assets.assets.prepare import DEPLOYMENT_MANIFEST, OP_NAME, ROLE_ENVIRONMENTS
from narwhal_assets.definitions import DEPLOYMENT
from narwhal_assets.runner import materialize_selection, operator_instance

EXIT_FAILED = 1


def run(args: argparse.Namespace) -> int:
    out = str(Path(args.out).resolve()) if args.out else ""
    config = {"ops": {OP_NAME: {"config": {"out": out}}}}
    result = materialize_selection(DEPLOYMENT, operator_instance(args.root), args.root, run_config=config)
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


def _metadata(result: dg.ExecuteInProcessResult) -> dict[dg.AssetKey, dict[str, object]]:
    return {
        m.asset_key: {key: value.value for key, value in m.metadata.items()}
        for m in result.asset_materializations_for_node(OP_NAME)
    }


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("prepare", help="write one verified deployment directory from the discovered config set")
    parser.add_argument("--out", metavar="DIR", help="a new directory (default: new under runs/deployment-env/)")
    parser.set_defaults(func=run)

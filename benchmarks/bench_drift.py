"""The rediscovery sensor's drift probe against `deploy-hosts discover` on the same simulated fleet.

Bar (DESIGN.md section 9, printed, never asserted): a drift check costs under 10% of a discovery's wall time
and hashes 0 checkpoint bytes. The baseline is an incremental discovery (unchanged files' hashes reused:
what a rediscovery without the drift probe would run), and a full-hash discovery is shown beside it. Best of
--repeat runs each, same process, warm Python. Needs root (network namespaces and real sshd).

On the simulated fleet `nvidia-smi` and `docker` are Python scripts and every host shares the workstation's
CPUs, so the probe's remote side costs far more here than on real hosts with native tools and their own CPUs.

    .venv/bin/python benchmarks/bench_drift.py [--hosts 8] [--files 32] [--mib 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import shlex
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from narwhal_assets.checkout import Checkout
from narwhal_assets.cli import main as deploy_hosts
from narwhal_assets.core.drift import DriftReport
from narwhal_assets.core.settings import Settings
from narwhal_assets.discovery import latest_complete_run, operator_settings
from narwhal_assets.fleetsim import SimFleet
from narwhal_assets.rediscovery import check_drift
from narwhal_assets.remote.probe import IP_ARGV, NVIDIA_SMI_ARGV
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.trust import TrustMode

TOOLS = f"{shlex.join(NVIDIA_SMI_ARGV)} >/dev/null & {shlex.join(IP_ARGV)} >/dev/null & docker image inspect"
ENGINE_ENV = [
    "NARWHAL_ENGINE_MODEL_NAME=bench",
    "NARWHAL_MODEL_DIR=/srv/models/bench",
    "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE=fab0",
]


def best_of(repeat: int, work: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    return best, result


def discover(root: Path, *args: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        if deploy_hosts(["--root", str(root), "discover", *args]) != 0:
            raise SystemExit("discovery failed")


def drift(root: Path) -> DriftReport:
    settings = operator_settings(Settings.load(root))
    run = latest_complete_run(settings)
    assert run is not None
    inventory = Checkout.from_settings(settings).inventory
    return check_drift(settings, inventory, run, make_connector(settings, TrustMode.STRICT))


def on_every_host(root: Path, command: str | None) -> None:
    """One strict connection per host running `command` (None: connect only), as the drift probe connects."""
    settings = operator_settings(Settings.load(root))
    accesses = host_accesses(settings, Checkout.from_settings(settings).inventory.hosts)
    make_connector(settings, TrustMode.STRICT).map_hosts(accesses, lambda c: command and c.run(command))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--files", type=int, default=32, help="checkpoint files per replica")
    parser.add_argument("--mib", type=int, default=2, help="MiB per checkpoint file")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(11)
    files = {f"model-{i:05d}.safetensors": rng.randbytes(args.mib << 20) for i in range(args.files)}
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp, SimFleet(Path(tmp) / "fleet") as fleet:
        for number in range(1, args.hosts + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", files, {"model_type": "llama"})
        root = Path(tmp) / "checkout"
        root.mkdir()
        roles = {f"engine-{n}": f"h{n}" for n in range(1, args.hosts + 1)} | {"router": "h1"}
        image = f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}"
        (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, *ENGINE_ENV]) + "\n")
        os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")
        discover(root)  # first discovery: enrols keys, hashes everything
        full, _ = best_of(1, lambda: discover(root, "--full-hash"))
        incremental, _ = best_of(args.repeat, lambda: discover(root))
        probe, report = best_of(args.repeat, lambda: drift(root))
        floor, _ = best_of(args.repeat, lambda: on_every_host(root, None))
        tools_command = f"{TOOLS} {shlex.quote(fleet.host('h1').image_ref)} >/dev/null & wait"
        tools, _ = best_of(args.repeat, lambda: on_every_host(root, tools_command))
    assert isinstance(report, DriftReport)
    if report.drift or report.unreachable:
        raise SystemExit("unexpected drift: " + "; ".join(report.lines()))
    size = args.hosts * args.files * args.mib
    print(f"{args.hosts} hosts, {args.files} files x {args.mib} MiB per replica ({size} MiB checkpoint bytes in all)")
    print(f"{'run':<28}{'wall s':>10}")
    print(f"{'discover --full-hash':<28}{full:>10.2f}")
    print(f"{'discover (incremental)':<28}{incremental:>10.2f}")
    print(f"{'drift probe (sensor tick)':<28}{probe:>10.2f}")
    print(f"{'  SSH connections alone':<28}{floor:>10.2f}")
    print(f"{'  connections + host tools':<28}{tools:>10.2f}  (nvidia-smi, ip, docker at once, without the probe)")
    print(f"drift probe / incremental discovery: {probe / incremental:.1%} (target < 10%)")
    print(f"drift probe / full-hash discovery:   {probe / full:.1%}")
    print(f"drift probe: {report.files_checked} checkpoint files statted, {report.bytes_read} bytes read (each")
    print(f"model's config.json; no other checkpoint file is opened) of {size << 20} checkpoint bytes")


if __name__ == "__main__":
    main()

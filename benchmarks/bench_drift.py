"""The rediscovery sensor's drift probe against `deploy-hosts discover` on the same simulated fleet.

Bar (printed, never asserted): a drift check costs under 10% of a discovery's wall time and hashes 0
checkpoint bytes. The baseline is an incremental discovery (unchanged files' hashes reused: what a
rediscovery without the drift probe would run), and a full-hash discovery is shown beside it. Discovery and
drift tick alternate --repeat times in the same process (warm Python), so load from other work on the
machine hits both alike; each pair gives a ratio, printed as min / median / max. Needs root (network
namespaces and real sshd).

Besides wall time, each run's CPU seconds are counted: this process's (workstation side: Dagster, SSH
client, parsing) and the simulated hosts' (everything their sshd ran, in one cgroup: sshd sessions, the
command guard with the probe in it, the tools). On a machine shared with other work the CPU ratio is the
steadier figure.
On the simulated fleet `nvidia-smi` and `docker` are Python scripts and every host shares the workstation's
CPUs, so the probe's remote side costs far more here than on real hosts with native tools and their own CPUs.

    .venv/bin/python benchmarks/bench_drift.py [--hosts 8] [--files 32] [--mib 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bench_install import HostsCpu
from fleetsim import SimFleet

from narwhal_assets.cli.main import main as deploy_hosts
from narwhal_assets.core.discovery.drift import DriftReport
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.host.probe import IP_ARGV, NVIDIA_SMI_ARGV
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.discover import latest_complete_run, operator_settings
from narwhal_assets.workflows.rediscover import check_drift

TOOLS = f"{shlex.join(NVIDIA_SMI_ARGV)} >/dev/null & {shlex.join(IP_ARGV)} >/dev/null & docker image inspect"
ENGINE_ENV = [
    "NARWHAL_ENGINE_MODEL_NAME=bench",
    "NARWHAL_MODEL_DIR=/srv/models/bench",
    "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE=fab0",
]


class Cost(NamedTuple):
    wall: float
    workstation_cpu: float
    hosts_cpu: float

    @property
    def cpu(self) -> float:
        return self.workstation_cpu + self.hosts_cpu


def measure(hosts: HostsCpu, work: Callable[[], object]) -> tuple[Cost, object]:
    own, before, started = time.process_time(), hosts.seconds(), time.perf_counter()
    result = work()
    wall = time.perf_counter() - started
    own = time.process_time() - own
    return Cost(wall, own, hosts.seconds() - before), result


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:.1%} / {statistics.median(ordered):.1%} / {ordered[-1]:.1%}"


def best_of(repeat: int, work: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    return best, result


def median_cost(costs: list[Cost]) -> Cost:
    return Cost(*(statistics.median(values) for values in zip(*costs, strict=True)))


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
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(11)
    files = {f"model-{i:05d}.safetensors": rng.randbytes(args.mib << 20) for i in range(args.files)}
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp, SimFleet(Path(tmp) / "fleet") as fleet:
        for number in range(1, args.hosts + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", files, {"model_type": "llama"})
        hosts = HostsCpu(fleet)
        root = Path(tmp) / "checkout"
        root.mkdir()
        roles = {f"engine-{n}": f"h{n}" for n in range(1, args.hosts + 1)} | {"router": "h1"}
        image = f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}"
        (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, *ENGINE_ENV]) + "\n")
        os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")
        discover(root)  # first discovery: enrols keys, hashes everything
        full, _ = measure(hosts, lambda: discover(root, "--full-hash"))
        pairs: list[tuple[Cost, Cost]] = []
        for _ in range(args.repeat):  # alternating, so both see the same load
            incremental, _ = measure(hosts, lambda: discover(root))
            probe, report = measure(hosts, lambda: drift(root))
            pairs.append((incremental, probe))
        floor, _ = best_of(args.repeat, lambda: on_every_host(root, None))
        tools_command = f"{TOOLS} {shlex.quote(fleet.host('h1').image_ref)} >/dev/null & wait"
        tools, _ = best_of(args.repeat, lambda: on_every_host(root, tools_command))
        hosts.close()
    assert isinstance(report, DriftReport)
    if report.drift or report.unreachable:
        raise SystemExit("unexpected drift: " + "; ".join(report.lines()))
    size = args.hosts * args.files * args.mib
    print(f"{args.hosts} hosts, {args.files} files x {args.mib} MiB per replica ({size} MiB checkpoint bytes in all)")
    discoveries, probes = [p[0] for p in pairs], [p[1] for p in pairs]
    print(f"{'run (median of pairs)':<28}{'wall s':>10}{'CPU s here':>12}{'CPU s hosts':>13}")
    for label, cost in (("discover --full-hash", full), ("discover (incremental)", median_cost(discoveries)),
                        ("drift probe (sensor tick)", median_cost(probes))):  # fmt: skip
        print(f"{label:<28}{cost.wall:>10.2f}{cost.workstation_cpu:>12.2f}{cost.hosts_cpu:>13.2f}")
    print(f"{'  SSH connections alone':<28}{floor:>10.2f}  (best of {args.repeat})")
    print(f"{'  connections + host tools':<28}{tools:>10.2f}  (nvidia-smi, ip, docker at once, without the probe)")
    print(f"drift / incremental discovery, min / median / max of {args.repeat} alternating pairs (target < 10%):")
    print(f"  wall: {spread([p.wall / d.wall for d, p in pairs])}   CPU: {spread([p.cpu / d.cpu for d, p in pairs])}")
    print(f"drift / full-hash discovery (median drift): wall {median_cost(probes).wall / full.wall:.1%}")
    print(f"drift probe: {report.files_checked} checkpoint files statted, {report.bytes_read} bytes read (each")
    print(f"model's config.json; no other checkpoint file is opened) of {size << 20} checkpoint bytes")


if __name__ == "__main__":
    main()

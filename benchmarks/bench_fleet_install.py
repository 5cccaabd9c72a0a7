"""Workstation CPU per extra host of install (first and reuse), rollback and status, as a slope between two
fleet sizes, and the reuse wall time against `status` on the same hosts.

Two checkouts share one simulated fleet: one whose inventory is its first --small hosts, one with all
--large. Each command runs over its checkout's whole fleet, so the slope (CPU of the large fleet minus CPU
of the small one, over the extra hosts) counts what grows with the selection (connections, the installer,
one event per host) and what grows with the inventory (the trust store, the SSH config, every role file read
back, the instance's partitions) alike; the fixed part (imports, the instance, the run) cancels out.

Each measurement (the least of `--repeat` rounds) is a fresh `deploy-hosts` process, as an operator runs
it; its CPU is the process and all its descendants (reaped children, this script being a subreaper). Targets
(printed, never asserted): <= 0.05 CPU-s per extra host for each command; reuse <= 1.3x `status` wall time
on the same hosts. Host-side work (git, venv) runs on this machine's CPUs too but is not counted: only the
workstation's processes are. Needs root.

The hosts' own work shares this machine's CPUs, and CPU time rises under contention (never falls), so each
cell starts once the machine is quiet again (a host's background work done) and keeps its least CPU over the
rounds. `--baseline DIR` measures another version of the package in the same rounds, interleaved cell by cell
with this one on the same hosts (DIR: a checkout of that version, for example `git worktree add /tmp/before
<commit>`; its `narwhal_assets` is imported first), and prints both.

First, what a connection costs while it waits: a staged host's connection stays open, idle, until every host
staged. Measured in this process over one connection per host: CPU per connection-second idle, against the
same connections each running `sleep` (keep-alives under way) as the baseline.

    .venv/bin/python benchmarks/bench_fleet_install.py [--small 4] [--large 32] [--repeat 3] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_install import PR_SET_CHILD_SUBREAPER, checkout, prepare, set_host_wait
from fleetsim import SimFleet
from process_meter import quiesce

from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.parallel import over_hosts
from narwhal_assets.ssh.trust import TrustMode

IDLE_S = 10.0


def measure(root: Path, *argv: str, code: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one `deploy-hosts` command (of the package in `code`, else this one) and every
    process it started, on the checkout's own instance; run in the checkout, so that no package in the
    current directory shadows `code`."""
    env = {**os.environ, "DAGSTER_HOME": str(root / "runs" / "dagster")} | ({"PYTHONPATH": str(code)} if code else {})
    quiesce()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), *argv],
                          capture_output=True, text=True, check=False, env=env, cwd=root)  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed:\n{done.stdout}{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def idle_cost(root: Path) -> None:
    """Workstation CPU per connection-second: idle connections against the same ones each running `sleep`."""
    checkout_ = Checkout.open(root)
    accesses = host_accesses(checkout_.settings, checkout_.inventory.hosts)
    connector = make_connector(checkout_.settings, TrustMode.STRICT)
    connections = over_hosts(accesses, connector.connect, len(accesses))
    try:
        idle = _cpu_per_connection_second(len(connections), lambda: time.sleep(IDLE_S))
        busy = _cpu_per_connection_second(
            len(connections), lambda: over_hosts(connections, lambda c: c.run(f"sleep {IDLE_S:g}"), len(connections))
        )
    finally:
        for connection in connections:
            connection.close()
    print(f"{len(connections)} connections, ms of workstation CPU per connection-second: idle {idle:.3f}, "
          f"running sleep {busy:.3f} (idle / busy {idle / busy:.2f})\n")


def _cpu_per_connection_second(connections: int, wait: Callable[[], object]) -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    wait()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - own.ru_utime) + (after.ru_stime - own.ru_stime)
    return cpu * 1000 / seconds / connections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=4)
    parser.add_argument("--large", type=int, default=32)
    parser.add_argument("--max-parallel", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each cell keeps its least CPU and wall")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="a checkout of another version, measured interleaved with this one")  # fmt: skip
    args = parser.parse_args()
    if args.baseline and not (args.baseline / "narwhal_assets" / "__main__.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: no narwhal_assets package there")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    versions: dict[str, Path | None] = {"this checkout": None}
    if args.baseline:
        versions[f"baseline {args.baseline}"] = args.baseline.resolve()
    figures: dict[str, dict[str, dict[int, tuple[float, float]]]] = {version: {} for version in versions}
    sizes = (args.small, args.large)
    parallel = ["--max-parallel", str(args.max_parallel)]
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp, SimFleet(Path(tmp) / "fleet") as fleet:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        for number in range(1, args.large + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        roots = {size: checkout(workdir, fleet, size, name=f"fleet-{size}") for size in sizes}
        set_host_wait(workdir, 0.0)
        idle_cost(roots[args.large])
        # What every round rolls back to: installed once per fleet; each round installs a new run over it.
        older = {size: prepare(roots[size], workdir / f"older-{size}") for size in sizes}
        for size in sizes:
            measure(roots[size], "install", "--run", str(older[size]), *parallel)
        cells = ((r, s, v) for r in range(args.repeat) for s in sizes for v in enumerate(versions))
        for round_, size, (index, version) in cells:
            root, code = roots[size], versions[version]
            newer = prepare(root, workdir / f"newer-{size}-{round_}-{index}")
            steps = {
                "install (first)": ("install", "--run", str(newer), *parallel),
                "install (reuse)": ("install", "--run", str(newer), *parallel),
                "rollback": ("rollback", "--run", str(older[size]), *parallel),
                "status": ("status",),
            }
            steps["rollback (already current)"] = steps["rollback"]
            for name, argv in steps.items():
                wall, cpu = measure(root, *argv, code=code)
                print(f"  round {round_ + 1}, {size}-host fleet, {version}: {name} {wall:.1f} s, {cpu:.2f} cpu s "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)  # fmt: skip
                best = figures[version].setdefault(name, {}).get(size, (wall, cpu))
                figures[version][name][size] = (min(wall, best[0]), min(cpu, best[1]))
    print(f"fleets of {args.small} and {args.large} simulated hosts, {os.cpu_count()} CPUs here, load average "
          f"{os.getloadavg()[0]:.1f} at the end; workstation CPU only (the command and its descendants)")
    for version, found in figures.items():
        report(version, found, args.small, args.large)


def report(version: str, figures: dict[str, dict[int, tuple[float, float]]], small: int, large: int) -> None:
    print(f"{version}:\n{'command':<34}{'cpu s @' + str(small):>11}{'cpu s @' + str(large):>11}"
          f"{'cpu s/extra host':>18}{'wall s @' + str(large):>12}")
    for name, by_size in figures.items():
        slope = (by_size[large][1] - by_size[small][1]) / (large - small)
        print(f"{name:<34}{by_size[small][1]:>11.2f}{by_size[large][1]:>11.2f}{slope:>18.3f}{by_size[large][0]:>12.2f}")
    reuse, status = figures["install (reuse)"][large][0], figures["status"][large][0]
    print(f"reuse / status wall on {large} hosts: {reuse / status:.2f}x (target <= 1.3x); per-host slope "
          "target <= 0.05 CPU-s")


if __name__ == "__main__":
    main()

"""Workstation CPU per extra host of install (first and reuse), rollback and status, as a slope between two
selections of one simulated fleet, and the reuse wall time against `status` on the same hosts.

Each measurement (the least of `--repeat` rounds) is a fresh `deploy-hosts` process, as an operator runs
it; its CPU is the process and all its descendants (reaped children, this script being a subreaper). The
slope (CPU at --large minus CPU at --small, over the extra hosts) is what one more host costs the
workstation; the fixed part (imports, the instance, the run) cancels out. Targets (printed, never
asserted): <= 0.05 CPU-s per extra host for each command; reuse <= 1.3x `status` wall time on the same
hosts. Host-side work (git, venv) runs on this machine's CPUs too but is not counted: only the
workstation's processes are. Needs root.

    .venv/bin/python benchmarks/bench_fleet_install.py [--small 4] [--large 32] [--repeat 2]
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
from pathlib import Path

from bench_install import PR_SET_CHILD_SUBREAPER, checkout, prepare, set_host_wait
from fleetsim import SimFleet


def measure(root: Path, *argv: str) -> tuple[float, float]:
    """Wall and CPU seconds of one `deploy-hosts` command and every process it started."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), *argv],
                          capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed:\n{done.stdout}{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def selection(count: int) -> list[str]:
    return [arg for n in range(1, count + 1) for arg in ("--host", f"node-{n}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=4)
    parser.add_argument("--large", type=int, default=32)
    parser.add_argument("--max-parallel", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each cell keeps its least CPU and wall")
    args = parser.parse_args()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    figures: dict[str, dict[int, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp, SimFleet(Path(tmp) / "fleet") as fleet:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        for number in range(1, args.large + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        root = checkout(workdir, fleet, args.large)
        set_host_wait(workdir, 0.0)
        parallel = ["--max-parallel", str(args.max_parallel)]
        for round_, size in ((r, s) for r in range(args.repeat) for s in (args.small, args.large)):
            hosts = selection(size)
            older = prepare(root, workdir / f"older-{size}-{round_}")
            newer = prepare(root, workdir / f"newer-{size}-{round_}")
            measure(root, "install", "--run", str(older), *hosts, *parallel)
            steps = {
                "install (first)": ("install", "--run", str(newer), *hosts, *parallel),
                "install (reuse)": ("install", "--run", str(newer), *hosts, *parallel),
                "rollback": ("rollback", "--run", str(older), *hosts, *parallel),
                "status": ("status", *hosts),
            }
            steps["rollback (already current)"] = steps["rollback"]
            for name, argv in steps.items():
                wall, cpu = measure(root, *argv)
                best = figures.setdefault(name, {}).get(size, (wall, cpu))
                figures[name][size] = (min(wall, best[0]), min(cpu, best[1]))
    extra = args.large - args.small
    print(f"{args.small} and {args.large} simulated hosts, {os.cpu_count()} CPUs here, load average "
          f"{os.getloadavg()[0]:.1f} at the end; workstation CPU only (the command and its descendants)")
    print(f"{'command':<34}{'cpu s @' + str(args.small):>11}{'cpu s @' + str(args.large):>11}"
          f"{'cpu s/extra host':>18}{'wall s @' + str(args.large):>12}")
    for name, by_size in figures.items():
        slope = (by_size[args.large][1] - by_size[args.small][1]) / extra
        print(f"{name:<34}{by_size[args.small][1]:>11.2f}{by_size[args.large][1]:>11.2f}{slope:>18.3f}"
              f"{by_size[args.large][0]:>12.2f}")
    reuse, status = figures["install (reuse)"][args.large][0], figures["status"][args.large][0]
    print(f"reuse / status wall on {args.large} hosts: {reuse / status:.2f}x (target <= 1.3x); per-host slope "
          "target <= 0.05 CPU-s")


if __name__ == "__main__":
    main()

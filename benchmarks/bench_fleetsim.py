"""Start-up time and memory per host of fleetsim fleets (default 16, 64 and 250 hosts), and their teardown.

Per size, one fleet of key-auth hosts with one fake GPU each (as the fleet benchmarks build them): the wall
time of `start()` (namespaces, accounts, links, host keys, every sshd answering its banner), the CPU it
took (this process and what it reaped: ip, useradd, ssh-keygen; the sshd processes themselves, still
running, are not in it), the memory the running fleet holds per host (MemAvailable before and after: the
hosts' processes, namespaces, links and mount tables; the kernel's slab part of it separately; the PSS of
the hosts' own processes), and the wall time of `close()`. The slope between sizes says whether start-up
stays linear. Needs root.

    .venv/bin/python benchmarks/bench_fleetsim.py [--sizes 16,64,250]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

from fleetsim import SimFleet
from fleetsim.system import host_processes, netns_inode


def meminfo() -> dict[str, int]:
    """/proc/meminfo in KiB."""
    return {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}


def pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)
    return total


def own_cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(size: int, workdir: Path) -> tuple[float, float, float, float, float, float]:
    """(start s, start cpu s, MiB per host, slab MiB per host, host processes' PSS MiB per host, close s)."""
    before = meminfo()
    fleet = SimFleet(workdir / f"fleet-{size}", capacity=size)
    for number in range(1, size + 1):
        fleet.add_host(f"h{number}", gpus=1)
    cpu = own_cpu()
    fleet.start()
    cpu = own_cpu() - cpu
    after = meminfo()
    inodes = {i for i in (netns_inode(h.netns) for h in fleet.hosts.values()) if i is not None}
    pss = pss_kib(host_processes(inodes, set()))
    began = time.monotonic()
    fleet.close()
    closed = time.monotonic() - began
    per_host = (before["MemAvailable"] - after["MemAvailable"]) / size / 1024
    slab = (after["Slab"] - before["Slab"]) / size / 1024
    return fleet.last_start_seconds or 0.0, cpu, per_host, slab, pss / size / 1024, closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,250", type=lambda text: sorted(int(s) for s in text.split(",")))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="narwhal-fleetsim-") as tmp:
        for size in args.sizes:
            rows.append((size, *measure(size, Path(tmp))))
            print(f"  {size} hosts: started in {rows[-1][1]:.1f} s", flush=True)
    print(f"fleetsim start-up, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n")
    print(
        "| hosts | start s | start s/host | start CPU s (fleetsim + reaped tools) | MiB per host (MemAvailable) "
        "| of it slab MiB | host processes' PSS MiB per host | close s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size, start, cpu, per_host, slab, pss, closed in rows:
        print(
            f"| {size} | {start:.1f} | {start / size * 1000:.0f} ms | {cpu:.1f} | {per_host:.2f} | {slab:.2f} "
            f"| {pss:.2f} | {closed:.1f} |"
        )
    (small, start_small, *_), (large, start_large, *_) = rows[0], rows[-1]
    if large > small:
        slope = (start_large - start_small) / (large - small) * 1000
        print(f"\nstart-up slope {small} -> {large} hosts: {slope:.0f} ms per extra host")


if __name__ == "__main__":
    main()

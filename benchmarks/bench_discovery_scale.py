"""Discovery time for N simulated hosts against one host, and SSH connections per host.

Bar (the design's, printed, never asserted): discovery of 32 hosts (no checkpoint hashing worth
mentioning: a tiny model) takes under 2x the time of one host, with one SSH connection per host.
Both runs use the same process, the same simulated-fleet harness and a warm Python; the best of
--repeat discoveries is kept. Needs root (network namespaces and real sshd).

    .venv/bin/python benchmarks/bench_discovery_scale.py [--hosts 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import tempfile
import time
from pathlib import Path

from fleetsim import SimFleet

from narwhal_assets.cli.main import main as deploy_hosts

ENGINE_ENV = [
    "NARWHAL_ENGINE_MODEL_NAME=bench",
    "NARWHAL_MODEL_DIR=/srv/models/bench",
    "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE=fab0",
]


def sshd_connections(fleet: SimFleet) -> int:
    """Accepted connections logged by every host's sshd so far."""
    return sum(
        len(re.findall(r"^Connection from ", log.read_text(errors="replace"), re.MULTILINE))
        for log in fleet.workdir.glob("hosts/*/sshd.log")
    )


def discover(workdir: Path, hosts: int, repeat: int) -> tuple[float, float, float]:
    """Best discovery wall time for a fleet of `hosts`, the workstation CPU seconds of that run, and SSH
    connections per host per discovery."""
    with SimFleet(workdir / f"fleet{hosts}") as fleet:
        for number in range(1, hosts + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        root = workdir / f"checkout{hosts}"
        root.mkdir()
        roles = {f"engine-{n}": f"h{n}" for n in range(1, hosts + 1)} | {"router": "h1"}
        image = f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}"
        (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, *ENGINE_ENV]) + "\n")
        os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")
        best, best_cpu = float("inf"), 0.0
        before = sshd_connections(fleet)
        for _ in range(repeat):
            started, cpu = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                rc = deploy_hosts(["--root", str(root), "discover"])
            if rc != 0:
                raise SystemExit("discovery failed")
            if time.perf_counter() - started < best:
                best, best_cpu = time.perf_counter() - started, time.process_time() - cpu
        return best, best_cpu, (sshd_connections(fleet) - before) / (hosts * repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        one, one_cpu, one_conn = discover(workdir, 2, args.repeat)
        many, many_cpu, many_conn = discover(workdir, args.hosts, args.repeat)
    print(f"{'fleet':<12}{'discover s':>12}{'workstation cpu s':>20}{'ssh conn/host':>16}")
    print(f"{'2 hosts':<12}{one:>12.2f}{one_cpu:>20.2f}{one_conn:>16.2f}")
    print(f"{args.hosts} hosts".ljust(12) + f"{many:>12.2f}{many_cpu:>20.2f}{many_conn:>16.2f}")
    print(f"ratio {args.hosts} hosts / 2 hosts: {many / one:.2f} (target < 2.0; {os.cpu_count()} CPUs here, shared by")
    print("the workstation and every simulated host's sshd and probe, which real hosts run on their own CPUs)")


if __name__ == "__main__":
    main()

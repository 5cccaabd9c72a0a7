"""Command-line cost: start-up of `--help` and `plan`, and `deploy-hosts discover` end to end on N hosts.

Baselines measured in the same run (printed, never asserted):
- start-up against `python -c "import dagster"` (target: `--help` and `plan` under half of it);
- `deploy-hosts discover` on N simulated hosts (a new process, as an operator runs it) against the floor of
  N parallel `ssh host 'python3 -c pass'` over the same fleet (target <= 1.5x);
- `deploy-hosts status` on 3 simulated hosts against `check-access` on the same hosts plus
  `python -c "import dagster"` (target <= 1.25x): status does check-access's work, then records it in Dagster.
The breakdown that follows says where the rest goes, each part measured the same way (best of --repeat):
the project's own transport running `python3 -c pass` on every host, the discovery probes alone
(`inspect_hosts`, no Dagster), the whole `discovery_job` in this already warm process, and importing the
code location in a new process (then also opening the instance); "workstation cpu" is this process's and
its children's CPU seconds. The fleet's hosts share this machine's CPUs, so host-side work (the probe and
the tools it runs, which the floor does not) competes with the workstation here, as it would not on a real
fleet: "machine cpu" counts every process on the machine (/proc/stat), and divided by the CPU count it is a
lower bound on the wall time a run can reach here however well it overlaps its parts.
Needs root for the fleet part (network namespaces and real sshd); `--startup-only` skips it.

    .venv/bin/python benchmarks/bench_cli.py [--hosts 32] [--repeat 3] [--startup-only | --status-only]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleetsim import SimFleet
from fleetsim.client import FleetSsh

from narwhal_assets.cli.main import main as deploy_hosts
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.discover import DiscoveryRun, inspect_hosts, new_run_dir, operator_settings

DEPLOY = [sys.executable, "-m", "narwhal_assets"]
IMPORT_DEFINITIONS = "import narwhal_assets.definitions"
OPEN_INSTANCE = IMPORT_DEFINITIONS + "; import sys, pathlib; import narwhal_assets.runtime.runner as runner"
OPEN_INSTANCE += "; runner.operator_instance(pathlib.Path(sys.argv[1]))"
ENGINE_ENV = [
    "NARWHAL_ENGINE_MODEL_NAME=bench",
    "NARWHAL_MODEL_DIR=/srv/models/bench",
    "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE=fab0",
]


Timing = tuple[float, float, float]  # wall seconds, workstation CPU seconds, machine CPU seconds


def best_of(repeat: int, action: Callable[[], None]) -> float:
    return timed(repeat, action)[0]


def timed(repeat: int, action: Callable[[], None]) -> Timing:
    """Best wall seconds of `repeat` runs, with the workstation's and the whole machine's CPU seconds of it."""
    best = (float("inf"), 0.0, 0.0)
    for _ in range(repeat):
        cpu, machine = _cpu_seconds(), _machine_cpu_seconds()
        started = time.perf_counter()
        action()
        wall = time.perf_counter() - started
        best = min(best, (wall, _cpu_seconds() - cpu, _machine_cpu_seconds() - machine))
    return best


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _machine_cpu_seconds() -> float:
    """Busy CPU seconds of every process on the machine (the fleet's hosts included) since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(argv: list[str], **kwargs: object) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {done.stderr[-2000:]}")


def startup(workdir: Path, repeat: int) -> None:
    root = workdir / "plan-checkout"
    root.mkdir()
    (root / ".env").write_text("NARWHAL_NODE_1_SSH=ops@gpu-a\nNARWHAL_NODE_2_SSH=ops@gpu-b\n")
    base = best_of(repeat, lambda: run([sys.executable, "-c", "import dagster"]))
    python = best_of(repeat, lambda: run([sys.executable, "-c", "pass"]))
    help_s = best_of(repeat, lambda: run([*DEPLOY, "--help"]))
    plan_s = best_of(repeat, lambda: run([*DEPLOY, "plan", "--root", str(root)]))
    print(f"{'start-up (best of ' + str(repeat) + ')':<34}{'seconds':>10}{'/ import dagster':>18}")
    for name, seconds in (("python -c pass", python), ("python -c 'import dagster'", base),
                          ("deploy-hosts --help", help_s), ("deploy-hosts plan", plan_s)):  # fmt: skip
        print(f"{name:<34}{seconds:>10.3f}{seconds / base:>18.2f}")
    print("target: --help and plan < 0.5x import dagster\n")


def end_to_end(workdir: Path, hosts: int, repeat: int) -> None:
    with SimFleet(workdir / "fleet") as fleet:
        for number in range(1, hosts + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        root = workdir / "checkout"
        root.mkdir()
        roles = {f"engine-{n}": f"h{n}" for n in range(1, hosts + 1)} | {"router": "h1"}
        image = f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}"
        (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, *ENGINE_ENV]) + "\n")
        ssh = FleetSsh.create(fleet.ssh_config_path, workdir)
        aliases = [fleet.host(f"h{n}").alias for n in range(1, hosts + 1)]

        def floor() -> None:
            results = ssh.run_all([(alias, "python3 -c pass") for alias in aliases])
            if any(r.returncode != 0 for r in results):
                raise SystemExit("ssh floor failed: " + next(r.stderr for r in results if r.returncode))

        floor()  # enrol the keys for OpenSSH
        env_home = {"DAGSTER_HOME": str(root / "runs" / "dagster")}
        discover = [*DEPLOY, "--root", str(root), "discover"]
        run(discover, env={**_env(), **env_home})  # first run enrols and hashes
        parts = breakdown(root, repeat)
        floor_s = timed(repeat, floor)
        discover_s = timed(repeat, lambda: run(discover, env={**_env(), **env_home}))
    cpus = os.cpu_count() or 1
    header = f"{hosts} hosts (best of {repeat})"
    print(f"{header:<34}{'seconds':>10}{'/ ssh floor':>14}{'workstation cpu s':>20}{'machine cpu s':>16}")
    rows = [("parallel ssh python3 -c pass", floor_s), ("deploy-hosts discover", discover_s)]
    for name, (wall, cpu, machine) in rows:
        print(f"{name:<34}{wall:>10.2f}{wall / floor_s[0]:>14.2f}{cpu:>20.2f}{machine:>16.2f}")
    bound = discover_s[2] / cpus
    print(f"target: discover <= 1.5x the ssh floor; its machine CPU on {cpus} CPUs bounds it here at >= "
          f"{bound:.2f} s = {bound / floor_s[0]:.2f}x\nwhere it goes:")
    for name, (wall, cpu, machine) in parts.items():
        print(f"  {name:<32}{wall:>10.2f}{wall / floor_s[0]:>14.2f}{cpu:>20.2f}{machine:>16.2f}")
    print(f"(load average {os.getloadavg()[0]:.1f} on {cpus} CPUs at the end)")


def status_cost(workdir: Path, repeat: int, hosts: int = 3) -> None:
    """`status` against what it cannot avoid: one strict connection per host (`check-access`) and Dagster's
    import (its records go to the instance); both measured as new processes, as an operator runs them."""
    with SimFleet(workdir / "status-fleet") as fleet:
        for number in range(1, hosts + 1):
            fleet.add_host(f"s{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        root = workdir / "status-checkout"
        root.mkdir()
        roles = {f"engine-{n}": f"s{n}" for n in range(1, hosts + 1)} | {"router": "s1"}
        image = f"NARWHAL_ENGINE_IMAGE={fleet.host('s1').image_ref}"
        (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, *ENGINE_ENV]) + "\n")
        env = {**_env(), "DAGSTER_HOME": str(root / "runs" / "dagster")}
        run([*DEPLOY, "--root", str(root), "discover"], env=env)  # enrols the host keys
        access = [*DEPLOY, "--root", str(root), "check-access"]
        status = [*DEPLOY, "--root", str(root), "status"]
        run(status, env=env)  # the instance exists, as on a workstation after its first command
        access_s = best_of(repeat, lambda: run(access, env=env))
        status_s = best_of(repeat, lambda: run(status, env=env))
        dagster_s = best_of(repeat, lambda: run([sys.executable, "-c", "import dagster"]))
        # What status cannot record without: Dagster and its SQL storage (SQLAlchemy, Alembic) imported, and
        # this checkout's instance opened.
        open_instance = ("from pathlib import Path; from narwhal_assets.runtime.runner import operator_instance; "
                         f"operator_instance(Path({str(root)!r}))")
        instance_s = best_of(repeat, lambda: run([sys.executable, "-c", open_instance], env=env))
        missing = workdir / "no-checkout"
        missing.mkdir()
        no_env_s = best_of(repeat, lambda: run_failing([*DEPLOY, "--root", str(missing), "status"]))
    floor = access_s + dagster_s
    print(f"{'status, ' + str(hosts) + ' hosts (best of ' + str(repeat) + ')':<34}{'seconds':>10}"
          f"{'/ check-access + import dagster':>34}")
    for name, seconds in (("deploy-hosts check-access", access_s), ("python -c 'import dagster'", dagster_s),
                          ("python: open the instance", instance_s), ("check-access + open the instance",
                                                                       access_s + instance_s),
                          ("deploy-hosts status", status_s), ("status without a .env (exit 2)", no_env_s)):
        print(f"{name:<34}{seconds:>10.3f}{seconds / floor:>34.2f}")
    print("target: status <= 1.25x check-access + import dagster. \"open the instance\" is a plain interpreter's "
          "cost (collector on while it imports, full finalization at exit); deploy-hosts pauses the collector "
          "while it loads and exits with its heap frozen (local/collector.py)\n")


def run_failing(argv: list[str]) -> None:
    """A command that must fail on bad input (exit 2)."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=_env())
    if done.returncode != 2:
        raise SystemExit(f"{' '.join(argv[:6])} exited {done.returncode}, not 2: {done.stderr[-2000:]}")


def breakdown(root: Path, repeat: int) -> dict[str, Timing]:
    """The parts of a discovery, each measured on its own (see the module docstring)."""
    os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")
    opened = Checkout.open(root)
    settings, inventory = operator_settings(opened.settings), opened.inventory
    accesses = host_accesses(settings, inventory.hosts)

    def transport() -> None:
        connector = make_connector(settings, TrustMode.STRICT)
        results = connector.map_hosts(accesses, lambda c: c.run("python3 -c pass", timeout=60).rc)
        if any(r != 0 for r in results.values()):
            raise SystemExit(f"transport floor failed: {results}")

    def probes() -> None:
        connector = make_connector(settings, TrustMode.STRICT)
        inspect_hosts(settings, inventory, connector, DiscoveryRun(new_run_dir(settings)), {})

    def job() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            if deploy_hosts(["--root", str(root), "discover"]) != 0:
                raise SystemExit("in-process discovery failed")

    job()  # warm: imports and first-use costs belong to the import line below
    return {
        "transport python3 -c pass": timed(repeat, transport),
        "probes only (inspect_hosts)": timed(repeat, probes),
        "discovery_job in a warm process": timed(repeat, job),
        "import the code location": timed(repeat, lambda: run([sys.executable, "-c", IMPORT_DEFINITIONS])),
        "... and open the instance": timed(repeat, lambda: run([sys.executable, "-c", OPEN_INSTANCE, str(root)])),
    }


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--startup-only", action="store_true")
    only.add_argument("--status-only", action="store_true", help="only status against check-access")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        if not args.status_only:
            startup(workdir, args.repeat)
        if not args.startup_only:
            status_cost(workdir, args.repeat)
        if not args.startup_only and not args.status_only:
            end_to_end(workdir, args.hosts, args.repeat)


if __name__ == "__main__":
    main()

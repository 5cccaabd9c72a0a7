"""Install of a prepared run on N simulated hosts: parallel against serial, and the reinstall (reuse) path.

Bars (printed, never asserted): a first install of 8 hosts in parallel is >= 3x faster than the same
install with `--max-parallel 1`; a complete reinstall sends 0 bytes and takes < 1 s per host.
Also printed: workstation CPU seconds per host (the `deploy-hosts install` process and its worker
processes, measured as reaped children) and host CPU seconds per host (everything each host's sshd ran, in
one cgroup: the connection, the installer, git, `python -m venv`, the install and check commands). Each
install is a fresh `deploy-hosts` process, as an operator runs it, against the same discovered checkout;
every first install uses its own prepared run (a new deployment id, so nothing is reused). Needs root
(network namespaces and real sshd).

The simulated hosts have no CPUs of their own: every host's work runs on this machine's few cores, beside
the workstation's, so a CPU-bound first install cannot run much faster in parallel than serially here,
whatever the workstation does. The first pair of installs is that raw figure. The second pair is the
representative one: the same installs, except that each host's install command first waits
`--host-wait` seconds, as `pip install` on a real host waits for downloads and compiles on that host's
own CPUs; it shows what the workstation side does with real, separate hosts. (Shaping the fleet's links
with netem would be the other way; this kernel has no netem.)

    .venv/bin/python benchmarks/bench_install.py [--hosts 8] [--host-wait 3]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import io
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleetsim import SimFleet
from process_meter import Cgroup

from narwhal_assets.cli.main import main as deploy_hosts

PR_SET_CHILD_SUBREAPER = 36
ENGINE_ENV = [
    "NARWHAL_ENGINE_MODEL_NAME=bench",
    "NARWHAL_MODEL_DIR=/srv/models/bench",
    "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE=fab0",
    "NARWHAL_REMOTE_CHECK=" + shlex.quote("python -I -c 'import app'"),
]
# The simulated hosts have no network: link the checkout into .venv, then import from it; first wait for
# as long as the file WAIT (see HOST_WAIT_FILE) says.
INSTALL = ("sleep \"$(cat WAIT)\" && python -c 'import pathlib, site; pathlib.Path(site.getsitepackages()[0],"
           " \"checkout.pth\").write_text(str(pathlib.Path.cwd()) + chr(10))'")  # fmt: skip
HOST_WAIT_FILE = "host-wait"  # seconds the install command waits, read on the host (the hosts share /tmp)
# `installed, activated (was none) (N files, B bytes sent; S s)`, `reused, already current (...)`: workflows.install
LINE_RE = re.compile(r"^  (\S+)\s+roles=\S+\s+(installed|reused), [^(]*(?:\(was \S+\) )?"
                     r"\((\d+) files, (\d+) bytes sent; ([0-9.]+) s\)$", re.M)


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}  # fmt: skip
    return subprocess.run(["git", "-C", str(root), *args], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def checkout(workdir: Path, fleet: SimFleet, hosts: int, name: str = "checkout", *, discover: bool = True) -> Path:
    """A git checkout with a tiny app, its .env for the fleet's first `hosts` hosts, discovered once here
    (unless `discover` is false: the caller runs and measures the first discovery)."""
    root = workdir / name
    (root / "app").mkdir(parents=True)
    (root / "app" / "__init__.py").write_text("")
    (root / ".gitignore").write_text("/.env\n/config/*.json\n/config/*.env\n/config/ssh.known_hosts*\n/runs/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "bench")
    roles = {f"engine-{n}": f"h{n}" for n in range(1, hosts + 1)} | {"router": "h1"}
    image = f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}"
    install = "NARWHAL_REMOTE_INSTALL=" + shlex.quote(INSTALL.replace("WAIT", str(workdir / HOST_WAIT_FILE)))
    (root / ".env").write_text("\n".join([*fleet.env_lines(roles), image, install, *ENGINE_ENV]) + "\n")
    set_host_wait(workdir, 0.0)
    os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")
    if discover:
        with contextlib.redirect_stdout(io.StringIO()):
            if deploy_hosts(["--root", str(root), "discover"]) != 0:
                raise SystemExit("discovery failed")
    with (root / ".env").open("a") as env:
        env.write(f"NARWHAL_DEPLOYMENT_REVISION={git(root, 'rev-parse', 'HEAD')}\n")
    return root


def set_host_wait(workdir: Path, seconds: float) -> None:
    wait = workdir / HOST_WAIT_FILE
    wait.write_text(f"{seconds}\n")
    wait.chmod(0o644)


class HostsCpu:
    """CPU seconds of everything the fleet's hosts run from now on: each host's sshd listener joins one cgroup,
    so every connection, session and command it forks is born there and counted, however it ends.

    (What sshd reaps is not that: a session whose parent exits before reaping it is reaped by init. With
    OpenSSH's own client, and so pyinfra's way of closing, a command's whole CPU never reached the listener:
    `python3 -c 'for i in range(10**7): pass'` over `ssh` added 4 ms there, over paramiko 350 ms.)"""

    def __init__(self, fleet: SimFleet) -> None:
        self.listeners = [int((host.hostdir / "sshd.pid").read_text()) for host in fleet.hosts.values()]
        self.group = Cgroup()
        for pid in self.listeners:
            self.group.procs_file.write_text(f"{pid}\n")

    def seconds(self) -> float:
        return self.group.cpu_seconds()

    def close(self) -> None:
        """The listeners back to the parent group; the group goes once the sessions it still has ended."""
        for pid in self.listeners:
            with contextlib.suppress(OSError):
                (self.group.path.parent / "cgroup.procs").write_text(f"{pid}\n")
        self.group.drain()
        self.group.remove()


def prepare(root: Path, out: Path) -> Path:
    os.environ["DAGSTER_HOME"] = str(root / "runs" / "dagster")  # the checkout's own instance
    with contextlib.redirect_stdout(io.StringIO()):
        if deploy_hosts(["--root", str(root), "prepare", "--out", str(out)]) != 0:
            raise SystemExit("prepare failed")
    return out


def install(root: Path, run: Path, *args: str) -> tuple[float, float, dict[str, tuple[str, int, float]]]:
    """Wall seconds, workstation CPU seconds (this install's processes) and host -> (outcome, bytes, s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "narwhal_assets", "--root", str(root), "install", "--run", str(run),
                           *args], capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"install failed:\n{done.stdout}{done.stderr}")
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hosts = {m.group(1): (m.group(2), int(m.group(4)), float(m.group(5))) for m in LINE_RE.finditer(done.stdout)}
    return wall, cpu, hosts


def _reap_orphans() -> None:
    """Wait for the install's fork server and workers, re-parented here, so their CPU time is counted."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--host-wait", type=float, default=3.0, help="seconds each host's install command waits")
    args = parser.parse_args()
    n = args.hosts
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    rows: list[tuple[str, float, float, float, int | str]] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp, SimFleet(Path(tmp) / "fleet") as fleet:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        for number in range(1, n + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        root = checkout(workdir, fleet, n)
        hosts = HostsCpu(fleet)
        walls: dict[str, float] = {}
        for label, wait in (("", 0.0), (f", hosts wait {args.host_wait:g} s", args.host_wait)):
            set_host_wait(workdir, wait)
            for parallel in (1, n):
                name = f"first, --max-parallel {parallel}{label}"
                run = prepare(root, workdir / f"run-{parallel}-{wait:g}")
                before = hosts.seconds()
                wall, cpu, first = install(root, run, "--max-parallel", str(parallel))
                walls[name] = wall
                sent = sum(b for _, b, _ in first.values())
                rows.append((name, wall, cpu / n, (hosts.seconds() - before) / n, sent))
        set_host_wait(workdir, 0.0)
        before = hosts.seconds()
        again_wall, again_cpu, again = install(root, run, "--max-parallel", str(n))
        resent = sum(b for _, b, _ in again.values())
        rows.append(("reinstall (reuse)", again_wall, again_cpu / n, (hosts.seconds() - before) / n, resent))
        hosts.close()
    print(f"{n} simulated hosts, {os.cpu_count()} CPUs here (shared by the workstation and every host's sshd,")
    print(f"installer, git, venv and install commands, which real hosts run on their own CPUs); load average "
          f"{os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print(f"{'install':<40}{'wall s':>8}{'workstation cpu s/host':>24}{'host cpu s/host':>17}{'bytes sent':>12}")
    for name, wall, ws_cpu, h_cpu, sent in rows:
        print(f"{name:<40}{wall:>8.2f}{ws_cpu:>24.2f}{h_cpu:>17.2f}{sent:>12}")
    names = list(walls)
    print(f"parallel / serial first-install speed-up, raw: {walls[names[0]] / walls[names[1]]:.2f}x; with hosts "
          f"waiting as real ones do: {walls[names[2]] / walls[names[3]]:.2f}x (target >= 3x)")  # fmt: skip
    outcomes = sorted({o for o, _, _ in again.values()})
    host_seconds = max(s for _, _, s in again.values())
    print(f"reinstall: {again_wall / n:.2f} s per host of wall time, slowest host {host_seconds:.2f} s on its own "
          f"(target < 1 s), {resent} bytes sent (target 0), outcomes {outcomes}")  # fmt: skip


if __name__ == "__main__":
    main()

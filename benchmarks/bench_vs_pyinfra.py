"""`deploy-hosts` against pyinfra 3.10 on the same simulated fleet of 4 and 16 hosts, in one run.

pyinfra is the peer: a general deployer over SSH (paramiko, gevent) with no orchestrator to load. Its deploy
here does what an install reuse must prove, minus what only we do: it puts the prepared run's source bundle
and the host's role file into a directory of the host user's home (`files.put`: upload unless the remote
SHA-1 matches), clones the bundle there once (as our installer does: no checkout, then the revision,
detached) and verifies the checkout (HEAD is the revision, the tree is clean) with `server.shell`.
Measured side by side, each a fresh process as an operator runs it, on the same hosts (first N of one
fleet), each in its own cgroup (process_meter: the command and all it starts):

| ours | pyinfra's |
|---|---|
| `deploy-hosts install` (first) | the deploy, first run |
| `deploy-hosts install` (reuse: verify, 0 bytes sent) | the deploy rerun with nothing to change |
| `deploy-hosts status` | `pyinfra INVENTORY exec -- hostname` (one command on every host) |
| the reuse and `status` again, preloaded (`deploy-hosts preload start` first) | the same two |

A preloaded command runs in a child of the preloaded process, which is started in a cgroup of its own: its
CPU is the caller's plus what that cgroup spent while the command ran.

Printed per command: CPU at 4 and 16 hosts, the fixed cost and CPU per extra host (the line through both),
wall at 16 hosts, the hosts' CPU at 16 (everything their sshd ran, in one cgroup: connections and the
command's work, which runs on these same CPUs and so adds to the wall here, as it would not on a real
fleet), and each of ours over its pyinfra counterpart. pyinfra runs with `-y` (no separate change-detection
pass) and its default parallelism (every host at once); ours at its defaults. The least of `--repeat` rounds
is kept (the hosts share this machine's CPUs, and contention only adds). `status` is measured on an instance
that has had one status already (the first creates the instance's database for runless events, 0.2-0.3 CPU-s
once). Host keys: pyinfra's own known-hosts file, accept-new on its first run, as ours enrols them in
`discover`.

pyinfra is installed from PyPI into a throwaway virtualenv under the run's temporary directory
(`--pyinfra-venv DIR` reuses or creates one there instead); it is never a dependency of this project. Needs
root (the fleet) and, unless `--pyinfra-venv` names a ready one, access to PyPI.

    .venv/bin/python benchmarks/bench_vs_pyinfra.py [--small 4] [--large 16] [--repeat 3] [--pyinfra-venv DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench_fleet_scale import Cell, Deployer
from bench_install import HostsCpu, checkout, git
from fleetsim import SimFleet
from process_meter import quiesce, run_measured, started

PYINFRA = "pyinfra==3.10.0"
Figures = tuple[float, float, float]  # wall, workstation CPU, the hosts' CPU (seconds)
OURS = {"install (first)": "deploy, first run", "install (reuse)": "deploy, no change", "status": "exec",
        "install (reuse), preloaded": "deploy, no change", "status, preloaded": "exec"}  # fmt: skip
DEPLOY = '''"""Put the source bundle and this host's role file, clone the bundle once, verify the checkout."""
from pyinfra import host
from pyinfra.operations import files, server

TOP = {top!r}
files.directory(name="deployment directory", path=TOP, mode="700")
files.put(name="source bundle", src={bundle!r}, dest=f"{{TOP}}/source.bundle", mode="600")
files.put(name="role file", src=host.data.role_file, dest=f"{{TOP}}/{{host.data.role_name}}", mode="600")
server.shell(name="checkout at the revision, clean", commands=[
    f"test -d {{TOP}}/checkout/.git || {{{{ git clone -q --no-checkout {{TOP}}/source.bundle {{TOP}}/checkout"
    f" && git -C {{TOP}}/checkout checkout -q --detach {revision}; }}}}",
    f'test "$(git -C {{TOP}}/checkout rev-parse HEAD)" = {revision}',
    f'test -z "$(git -C {{TOP}}/checkout status --porcelain)"',
])
'''


def pyinfra_bin(venv: Path) -> Path:
    """`venv`'s pyinfra executable, installing pyinfra 3.10 there first unless it is already there."""
    executable = venv / "bin" / "pyinfra"
    if not executable.exists():
        print(f"installing {PYINFRA} into {venv} (a throwaway virtualenv)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # No constraint file: this project's pins are for this project; pyinfra brings its own dependencies.
        env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        PYINFRA], check=True, env=env)  # fmt: skip
    return executable


def role_files(run: Path, hosts: int) -> dict[int, Path]:
    """host number -> the prepared run's role file of engine-<number> (wherever the run's layout puts it)."""
    found = {int(path.name.rsplit("-", 1)[1]): path for path in run.rglob(".env.engine-*")}
    missing = [n for n in range(1, hosts + 1) if n not in found]
    if missing:
        raise SystemExit(f"{run}: no role file .env.engine-N for hosts {missing}")
    return found


def write_inventory(path: Path, fleet: SimFleet, hosts: int, roles: dict[int, Path], known_hosts: Path) -> Path:
    entries = []
    for number in range(1, hosts + 1):
        host = fleet.host(f"h{number}")
        entries.append((host.address, {
            "ssh_user": host.user, "ssh_port": host.port, "ssh_key": str(fleet.client_key_path),
            "ssh_known_hosts_file": str(known_hosts), "ssh_strict_host_key_checking": "accept-new",
            "role_file": str(roles[number]), "role_name": roles[number].name,
        }))  # fmt: skip
    path.write_text(f"hosts = {entries!r}\n", encoding="utf-8")  # (host, data) tuples: what pyinfra reads
    return path


class Pyinfra:
    """pyinfra runs on one inventory, each in its own cgroup; returns (wall, cpu)."""

    def __init__(self, executable: Path, inventory: Path, workdir: Path) -> None:
        self.executable, self.inventory, self.workdir = executable, inventory, workdir

    def run(self, *argv: str) -> tuple[float, float]:
        quiesce()
        usage = run_measured([str(self.executable), "-y", str(self.inventory), *argv], cwd=self.workdir)
        if usage.returncode != 0:
            raise SystemExit(f"pyinfra {' '.join(argv)} exited {usage.returncode}:\n{usage.stdout[-3000:]}"
                             f"{usage.stderr[-3000:]}")  # fmt: skip
        line = f"    pyinfra {Path(argv[0]).name:<20} {usage.wall:7.2f} s wall {usage.cpu:7.2f} cpu s"
        print(line, file=sys.stderr, flush=True)
        return usage.wall, usage.cpu


def measure(
    size: int, round_: int, fleet: SimFleet, hosts: HostsCpu, executable: Path, workdir: Path
) -> dict[str, Figures]:
    """Every cell of one round on the fleet's first `size` hosts: name -> (wall, cpu, the hosts' cpu)."""
    print(f"  round {round_ + 1}, {size} hosts:", file=sys.stderr, flush=True)
    root = checkout(workdir, fleet, size, name=f"checkout-{size}-{round_}")
    ours = Deployer(root, None)
    run, _ = ours.prepare("run")
    here = workdir / f"pyinfra-{size}-{round_}"
    here.mkdir()
    known_hosts = here / "known_hosts"
    known_hosts.touch(mode=0o600)
    inventory = write_inventory(here / "inventory.py", fleet, size, role_files(run, size), known_hosts)
    bundle = next(run.rglob("source.bundle"))
    top = f"pyinfra-deploy-{size}-{round_}"
    deploy = here / "deploy.py"
    deploy.write_text(DEPLOY.format(top=top, bundle=str(bundle),
                                    revision=git(root, "rev-parse", "HEAD")), encoding="utf-8")  # fmt: skip
    peer = Pyinfra(executable, inventory, here)
    cells: dict[str, Figures] = {}

    def on_hosts(action: Callable[[], tuple[float, float]]) -> Figures:
        before = hosts.seconds()
        wall, cpu = action()
        return wall, cpu, hosts.seconds() - before
    for name, action in (("deploy, first run", lambda: peer.run(str(deploy))),
                         ("install (first)", lambda: _ours(ours.install(run))),
                         ("deploy, no change", lambda: peer.run(str(deploy))),
                         ("install (reuse)", lambda: _ours(ours.install(run))),
                         ("exec", lambda: peer.run("exec", "--", "hostname")),
                         ("status", lambda: _ours(ours.run("status")))):  # fmt: skip
        if name == "status":  # an operator's status, not the instance's first: that one makes its runless shard
            ours.run("status")
        cells[name] = on_hosts(action)
        if name == "deploy, first run":
            _check_deployed(fleet, size, top)
    with preloaded(ours, here) as measured:
        cells["install (reuse), preloaded"] = on_hosts(lambda: measured(lambda: ours.install(run)))
        cells["status, preloaded"] = on_hosts(lambda: measured(lambda: ours.run("status")))
    return cells


@contextlib.contextmanager
def preloaded(ours: Deployer, here: Path) -> Iterator[Callable[[Callable[[], Cell]], tuple[float, float]]]:
    """`deploy-hosts preload start` for the checkout's environment, the process it starts in a cgroup of its
    own; yields a measure of one command: (wall, the caller's CPU + the cgroup's while it ran)."""
    argv = [sys.executable, "-m", "narwhal_assets", "preload", "start", "--idle", "10"]
    with started(argv, log=here / "preload.log", env=ours.env, cwd=Path("/")) as (proc, group):
        if proc.wait(timeout=300) != 0:
            raise SystemExit(f"`deploy-hosts preload start` exited {proc.returncode}: see {here / 'preload.log'}")

        def measured(command: Callable[[], Cell]) -> tuple[float, float]:
            before = group.cpu_seconds()
            cell = command()
            return cell.wall, cell.cpu + group.cpu_seconds() - before

        try:
            yield measured
        finally:
            subprocess.run([*argv[:4], "stop"], env=ours.env, cwd="/", capture_output=True, check=False)


def _check_deployed(fleet: SimFleet, size: int, top: str) -> None:
    """pyinfra's first run cloned the checkout on every host (it exits 0 when it reached none)."""
    missing = [
        f"h{n}" for n in range(1, size + 1) if not (fleet.host(f"h{n}").home / top / "checkout" / ".git").is_dir()
    ]
    if missing:
        raise SystemExit(f"pyinfra's deploy left no checkout on {', '.join(missing)}")


def _ours(cell: Cell) -> tuple[float, float]:
    return cell.wall, cell.cpu


def report(figures: dict[int, dict[str, Figures]], small: int, large: int) -> str:
    lines = [f"deploy-hosts against {PYINFRA.replace('==', ' ')} on {small} and {large} simulated hosts "
             "(workstation CPU: the command and all its descendants; the hosts' CPU: their SSH sessions, on the "
             "same CPUs; least of the rounds)", "",
             f"| command | CPU s @{small} | CPU s @{large} | fixed s | CPU s/host | wall s @{large} "
             f"| hosts' CPU s @{large} | CPU / peer's | wall / peer's |", "|---" * 9 + "|"]  # fmt: skip
    for theirs in dict.fromkeys(OURS.values()):
        for name, peer in ((theirs, None), *((ours, theirs) for ours, peer in OURS.items() if peer == theirs)):
            (_, cpu_s, _), (wall_l, cpu_l, hosts_l) = figures[small][name], figures[large][name]
            slope = (cpu_l - cpu_s) / (large - small)
            ratios = "| | |"
            if peer is not None:
                ratios = f"| {cpu_l / figures[large][peer][1]:.2f}x | {wall_l / figures[large][peer][0]:.2f}x |"
            lines.append(f"| {name} | {cpu_s:.2f} | {cpu_l:.2f} | {cpu_s - slope * small:.2f} | {slope * 1000:.1f} ms "
                         f"| {wall_l:.2f} | {hosts_l:.2f} {ratios}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=4)
    parser.add_argument("--large", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each cell keeps its least CPU and wall")
    parser.add_argument("--pyinfra-venv", type=Path, default=None, metavar="DIR",
                        help="a virtualenv to reuse (or create) for pyinfra, instead of a throwaway one")  # fmt: skip
    args = parser.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        runtime = workdir / "runtime"  # the preloaded processes' sockets, never a user's own
        runtime.mkdir(mode=0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        executable = pyinfra_bin(args.pyinfra_venv or workdir / "pyinfra-venv")
        version = subprocess.run([str(executable), "--version"], capture_output=True, text=True).stdout.strip()
        figures: dict[int, dict[str, Figures]] = {}
        with SimFleet(workdir / "fleet") as fleet:
            for number in range(1, args.large + 1):
                fleet.add_host(f"h{number}", gpus=1)
            fleet.start()
            fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
            hosts = HostsCpu(fleet)
            for round_ in range(args.repeat):
                for size in (args.small, args.large):
                    found = measure(size, round_, fleet, hosts, executable, workdir)
                    best = figures.setdefault(size, found)
                    for name, cell in found.items():
                        best[name] = (min(cell[0], best[name][0]), min(cell[1], best[name][1]),
                                      min(cell[2], best[name][2]))  # fmt: skip
            hosts.close()
    print(
        f"{version}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end, "
        f"{(time.monotonic() - began) / 60:.1f} min\n"
    )
    print(report(figures, args.small, args.large))


if __name__ == "__main__":
    main()

"""Every `deploy-hosts` command at three fleet sizes (default 25, 80 and 250 simulated hosts): how each grows.

One simulated fleet of the largest size; one checkout per size whose inventory is the fleet's first N hosts
(h1 router + engine-1, every other host one engine). In each checkout, in order: `discover` (the first one:
host keys enrolled), `check-access`, `prepare` (run A), `install` A (first), `install` A again (reuse),
`status`, `prepare` (run B) and `install` B (second samples of prepare and a first install), `rollback` to A.
Each is a fresh `deploy-hosts` process, as an operator runs it, measured by process_meter: workstation CPU
of the command and every process it started (its own cgroup), wall time, peak memory (PSS of the tree),
peak SSH sessions, threads and file descriptors (sampled from /proc), and the bytes it added under the
checkout's `runs/` and `config/` (split into host logs, Dagster's storage, and the rest). Per command it
prints the fixed cost and the CPU per extra host (a least-squares line over the three sizes, and the slope
of each interval: a superlinear command's slope grows), the exponent k of CPU = a + b N^k through the three
points (n/a when an interval rises less than NOISE_CPU_S, which repeated runs differ by) and, with
--repeat, the same exponent for each set of samples taken in turn (its spread is the machine's), the bytes
written per host, and for install (first) and rollback the activation window (from the first to the last
host whose `~/Narwhal-deploy/current` moved, read from the links' own mtimes); per generated artifact (the
config set, the discovery run directory, the prepared run directory; per-host files grouped as one kind)
its size at each size and its growth exponent (log size against log hosts, least squares).

Round trips: on a second, small fleet (`--rtt-hosts`, default 2) whose hosts sit behind fleetsim's
latency relay, each command runs with the relay at 0 and at `--latency-ms` each way (interleaved, the least
wall of `--rtt-repeat` rounds); round trips = (wall at L - wall at 0) / RTT, with the hosts in parallel, so
the figure is one host's sequence of exchanges.

The UI's install: on a third small fleet (`--ui-sizes`, default 2 and 8 hosts), a backfill of
`host_installation` over every host, launched through `deploy-hosts ui` as the UI's button does
(ui_backfill.py), beside a CLI `install` (first) of a new run on the same hosts: CPU per host and Dagster
storage per host of each.

Host-side work is kept small (the install command links the checkout into `.venv` with a `.pth` file and the
check imports it; bench_install's settings), so the shared CPUs mostly measure the workstation; the hosts'
own `python -m venv` (about 3 CPU-s per host and first install) and probes still run on them, which
inflates wall time (not the cgroup's CPU, except through contention). So the scale runs keep the hosts at
the lowest CPU share (process_meter.lowest_cpu_share; `--hosts-share default` for the old way): the command
runs whenever it can, as beside a real fleet whose hosts have CPUs of their own. Each measurement starts once
the machine is quiet (process_meter.quiesce). Targets (printed, never asserted): every command linear
(k <= 1.1), prepare <= 10 ms per extra host, install's peaks independent of N, a reuse <= 4 KB of log per
host, every artifact's exponent <= 1.1 (the engine role files list every peer's address: ~2 for their sum).
Needs root.

    .venv/bin/python benchmarks/bench_fleet_scale.py [--sizes 25,80,250] [--max-parallel N] [--repeat 1]
        [--hosts-share lowest|default]
        [--rtt-hosts 2] [--latency-ms 100] [--rtt-repeat 2] [--ui-sizes 2,8] [--skip scale,rtt,ui]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench_install import checkout
from fleetsim import SimFleet
from process_meter import Usage, lowest_cpu_share, quiesce, run_measured
from ui_backfill import Backfill, measure_backfill

COMMANDS = ["discover", "check-access", "prepare", "install (first)", "install (reuse)", "status", "rollback"]
PARTS = {"scale", "rtt", "ui"}
NOISE_CPU_S = 0.25  # how far one command's CPU varies between runs here (2 shared CPUs)
RTT_COMMANDS = ["discover", "check-access", "install (first)", "install (reuse)", "status", "rollback"]
NORMALIZE = [
    (re.compile(r"\d{8}T\d{6}Z-[0-9a-f]+"), "<run>"),
    (re.compile(r"[0-9a-f]{16,}"), "<hash>"),
    (re.compile(r"(?<=node-)\d+|(?<=engine-)\d+"), "*"),
]


@dataclass
class Cell:
    """One command at one size: every sample's CPU in the order taken (the same order at every size, so the
    i-th samples of all sizes give one exponent each: how far apart they are is how much the machine moved),
    the least wall, and the peaks and bytes of the last sample."""

    usage: Usage
    written: dict[str, int]
    samples: list[float]
    wall: float
    window: float | None = None  # activation window: first to last host whose `current` moved (seconds)

    @property
    def cpu(self) -> float:
        """The least CPU of the samples (the one least disturbed by the rest of the machine)."""
        return min(self.samples)

    def merge(self, other: Cell) -> Cell:
        other.samples, other.wall = [*self.samples, *other.samples], min(self.wall, other.wall)
        windows = [w for w in (self.window, other.window) if w is not None]
        other.window = max(windows) if windows else None
        return other


@dataclass
class Scale:
    """Everything measured at one fleet size."""

    cells: dict[str, Cell] = field(default_factory=dict)
    artifacts: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (files, bytes)


class Deployer:
    """Runs `deploy-hosts` commands on one checkout, each measured in its own cgroup."""

    def __init__(self, root: Path, max_parallel: int | None) -> None:
        self.root = root
        self.parallel = [] if max_parallel is None else ["--max-parallel", str(max_parallel)]
        self.env = {**os.environ, "DAGSTER_HOME": str(root / "runs" / "dagster"), "DAGSTER_DISABLE_TELEMETRY": "1"}

    def run(self, *argv: str) -> Cell:
        quiesce()
        before = written_bytes(self.root)
        usage = run_measured([sys.executable, "-m", "narwhal_assets", "--root", str(self.root), *argv],
                             env=self.env, cwd=self.root)  # fmt: skip
        if usage.returncode != 0:
            raise SystemExit(f"`deploy-hosts {' '.join(argv)}` in {self.root} exited {usage.returncode}:\n"
                             f"{usage.stdout[-3000:]}{usage.stderr[-3000:]}")  # fmt: skip
        after = written_bytes(self.root)
        written = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in {*before, *after}}
        print(f"    {argv[0]:<13} {usage.wall:7.2f} s wall {usage.cpu:7.2f} cpu s  {usage.peak_pss >> 20:5d} MB "
              f"{usage.peak_sessions:4d} sessions {usage.peak_threads:4d} threads {usage.peak_fds:4d} fds "
              f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)  # fmt: skip
        return Cell(usage, written, [usage.cpu], usage.wall)

    def prepare(self, name: str) -> tuple[Path, Cell]:
        out = self.root / "runs" / "deployment-env" / name
        return out, self.run("prepare", "--out", str(out))

    def install(self, run: Path) -> Cell:
        return self.run("install", "--run", str(run), *self.parallel)

    def rollback(self, run: Path) -> Cell:
        return self.run("rollback", "--run", str(run), *self.parallel)


def written_bytes(root: Path) -> dict[str, int]:
    """Bytes under the checkout's runs/ and config/: host logs (any `logs/` directory), Dagster's storage
    (runs/dagster), and everything else."""
    found = {"logs": 0, "dagster": 0, "other": 0}
    for top in (root / "runs", root / "config"):
        for path, size in _files(top):
            parts = path.relative_to(root).parts
            kind = "dagster" if parts[:2] == ("runs", "dagster") else "logs" if "logs" in parts else "other"
            found[kind] += size
    return found


def _files(top: Path) -> Iterable[tuple[Path, int]]:
    for directory, _, names in os.walk(top):
        for name in names:
            path = Path(directory, name)
            try:
                yield path, path.lstat().st_size
            except FileNotFoundError:
                continue


def artifact_kinds(top: Path, label: str) -> dict[str, tuple[int, int]]:
    """Files under `top` grouped by name with host numbers, run ids and hashes taken out: kind -> (files, bytes),
    and the whole directory as one more kind."""
    kinds: dict[str, tuple[int, int]] = {}
    total = count = 0
    for path, size in _files(top):
        name = str(path.relative_to(top))
        for pattern, replacement in NORMALIZE:
            name = pattern.sub(replacement, name)
        files, size_sum = kinds.get(f"{label}/{name}", (0, 0))
        kinds[f"{label}/{name}"] = (files + 1, size_sum + size)
        total, count = total + size, count + 1
    kinds[f"{label}/ (whole directory)"] = (count, total)
    return kinds


def newest(directory: Path) -> Path | None:
    """The most recently made run directory under `directory` (None when there is none)."""
    runs = [path for path in directory.glob("*") if path.is_dir() and path.name != "objects"]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def measure_size(deployer: Deployer, homes: list[Path]) -> Scale:
    """The command sequence of the module docstring on one checkout whose hosts' homes (seen from here) are
    `homes`."""
    scale = Scale()
    root = deployer.root
    scale.cells["discover"] = deployer.run("discover")
    scale.artifacts |= artifact_kinds(root / "config", "config")
    if (run := newest(root / "runs" / "discovery")) is not None:
        scale.artifacts |= artifact_kinds(run, "discovery run")
    scale.cells["check-access"] = deployer.run("check-access")
    older, scale.cells["prepare"] = deployer.prepare("A")
    scale.artifacts |= artifact_kinds(older, "prepared run")
    scale.cells["install (first)"] = activated(deployer.install(older), homes)
    scale.cells["install (reuse)"] = deployer.install(older)
    scale.cells["status"] = deployer.run("status")
    newer, again = deployer.prepare("B")
    scale.cells["prepare"] = scale.cells["prepare"].merge(again)
    scale.cells["install (first)"] = scale.cells["install (first)"].merge(activated(deployer.install(newer), homes))
    scale.cells["rollback"] = activated(deployer.rollback(older), homes)
    return scale


def activated(cell: Cell, homes: list[Path]) -> Cell:
    """`cell` with its activation window: how far apart the hosts' `~/Narwhal-deploy/current` links were made
    (each move replaces the link, so its own mtime is when that host's `current` moved)."""
    times = [(home / "Narwhal-deploy" / "current").lstat().st_mtime for home in homes]
    cell.window = max(times) - min(times)
    return cell


def run_scale(
    sizes: list[int], max_parallel: int | None, repeat: int, workdir: Path, hosts_share: str
) -> tuple[dict[int, Scale], str]:
    largest = max(sizes)
    memory_before = _mem_available()
    with SimFleet(workdir / "fleet", capacity=largest) as fleet:
        for number in range(1, largest + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet_line = (f"{largest}-host fleet started in {fleet.last_start_seconds:.1f} s, "
                      f"{(memory_before - _mem_available()) / largest / 1024:.1f} MiB of memory per host")  # fmt: skip
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        listeners = [int((host.hostdir / "sshd.pid").read_text()) for host in fleet.hosts.values()]
        default = contextlib.nullcontext("the default CPU share")
        at_share = lowest_cpu_share(listeners) if hosts_share == "lowest" else default
        with at_share as share:
            fleet_line += f"; the hosts at {share}"
            print(fleet_line, file=sys.stderr, flush=True)
            return _scale_rounds(sizes, max_parallel, repeat, workdir, fleet), fleet_line


def _scale_rounds(
    sizes: list[int], max_parallel: int | None, repeat: int, workdir: Path, fleet: SimFleet
) -> dict[int, Scale]:
    scales: dict[int, Scale] = {}
    for round_ in range(repeat):
        for size in sizes:
            print(f"  round {round_ + 1}, {size} hosts:", file=sys.stderr, flush=True)
            root = checkout(workdir, fleet, size, name=f"fleet-{size}-{round_}", discover=False)
            homes = [fleet.host(f"h{n}").home for n in range(1, size + 1)]
            found = measure_size(Deployer(root, max_parallel), homes)
            if size in scales:
                for name, cell in found.cells.items():
                    found.cells[name] = scales[size].cells[name].merge(cell)
            scales[size] = found
    return scales


def _mem_available() -> int:
    """MemAvailable in KiB: what the kernel could still hand out (host processes, namespaces, page tables)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def run_rtt(
    hosts: int, latency_ms: float, repeat: int, max_parallel: int | None, workdir: Path
) -> dict[str, dict[float, float]]:
    """command -> latency (one-way s) -> least wall seconds, on a fleet behind relays."""
    latency = latency_ms / 1000
    walls: dict[str, dict[float, float]] = {name: {} for name in RTT_COMMANDS}
    with SimFleet(workdir / "rtt-fleet") as fleet:
        for number in range(1, hosts + 1):
            fleet.add_host(f"h{number}", gpus=1, latency=0.0)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        deployer = Deployer(checkout(workdir, fleet, hosts, name="rtt"), max_parallel)
        deployer.run("discover")
        previous, _ = deployer.prepare("rtt-0")
        deployer.install(previous)
        for round_ in range(repeat):
            for one_way in (0.0, latency):
                for name in fleet.hosts:
                    fleet.set_latency(name, one_way)
                print(f"  round {round_ + 1}, {hosts} hosts at {one_way * 1000:g} ms each way:", file=sys.stderr)
                current, _ = deployer.prepare(f"rtt-{round_}-{one_way:g}")
                cells = {"discover": deployer.run("discover"), "check-access": deployer.run("check-access"),
                         "install (first)": deployer.install(current), "install (reuse)": deployer.install(current),
                         "status": deployer.run("status"), "rollback": deployer.rollback(previous)}  # fmt: skip
                deployer.install(current)  # current again, so the next round rolls back to this run
                previous = current
                for name, cell in cells.items():
                    walls[name][one_way] = min(cell.wall, walls[name].get(one_way, math.inf))
        for name in fleet.hosts:
            fleet.set_latency(name, 0.0)
    return walls


def run_ui(sizes: list[int], max_parallel: int | None, workdir: Path) -> dict[int, tuple[Backfill, Cell]]:
    """size -> (the UI backfill of a first install, a CLI first install of a newer run on the same hosts)."""
    found: dict[int, tuple[Backfill, Cell]] = {}
    with SimFleet(workdir / "ui-fleet") as fleet:
        for number in range(1, max(sizes) + 1):
            fleet.add_host(f"h{number}", gpus=1)
        fleet.start()
        fleet.write_model("bench", {"weights.bin": b"\0" * 4096}, {"model_type": "llama"})
        for size in sizes:
            print(f"  UI backfill, {size} hosts:", file=sys.stderr, flush=True)
            deployer = Deployer(checkout(workdir, fleet, size, name=f"ui-{size}"), max_parallel)
            deployer.prepare("ui")
            backfill = measure_backfill(deployer.root, deployer.env)
            print(f"    backfill      {backfill.wall:7.2f} s wall {backfill.cpu:7.2f} cpu s  {backfill.runs} runs",
                  file=sys.stderr, flush=True)  # fmt: skip
            newer, _ = deployer.prepare("cli")
            found[size] = (backfill, deployer.install(newer))
    return found


# --- fits ---------------------------------------------------------------------------------------------------


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y - b * mean_x, b


def power_exponent(sizes: list[int], values: list[float]) -> float | None:
    """k of value = a + b N^k through three points (None unless each interval rises by NOISE_CPU_S or more:
    below that, repeated runs of one command differ by as much, and k says nothing)."""
    (n1, n2, n3), (c1, c2, c3) = sizes[:3], values[:3]
    if not (c2 - c1 >= NOISE_CPU_S and c3 - c2 >= NOISE_CPU_S):
        return None
    ratio = (c3 - c1) / (c2 - c1)

    def shape(k: float) -> float:
        return (n3**k - n1**k) / (n2**k - n1**k)

    low, high = 0.01, 6.0
    if not shape(low) <= ratio <= shape(high):
        return low if ratio < shape(low) else high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if shape(middle) < ratio else (low, middle)
    return (low + high) / 2


def log_exponent(sizes: list[int], values: list[int]) -> float | None:
    if min(values) <= 0:
        return None
    return line_fit([math.log(n) for n in sizes], [math.log(v) for v in values])[1]


# --- report -------------------------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def scale_tables(scales: dict[int, Scale]) -> str:
    sizes = sorted(scales)
    lines = [
        f"Workstation cost per command at {', '.join(map(str, sizes))} hosts (CPU: the command and all its "
        "descendants; peaks: its process tree, sampled; bytes: what it added under runs/ and config/).",
        "",
        "| command | CPU fixed s | CPU s/host (fit) | CPU s/host per interval | exponent k | k per sample | CPU s "
        "| wall s | peak MB (PSS) | peak sessions | peak threads | peak fds | bytes/host (logs + dagster + other) "
        "| activation window s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in COMMANDS:
        cells = [scales[size].cells[name] for size in sizes]
        cpu = [cell.cpu for cell in cells]
        fixed, slope = line_fit([float(s) for s in sizes], cpu)
        steps = range(len(sizes) - 1)
        intervals = " / ".join(f"{(cpu[i + 1] - cpu[i]) / (sizes[i + 1] - sizes[i]) * 1000:.1f}" for i in steps)
        k = power_exponent(sizes, cpu) if len(sizes) >= 3 else None
        sets = zip(*(c.samples for c in cells), strict=False) if len(sizes) >= 3 else ()
        by_sample = [power_exponent(sizes, list(taken)) for taken in sets]
        per_host = {kind: (cells[-1].written[kind] - cells[0].written[kind]) / (sizes[-1] - sizes[0])
                    for kind in ("logs", "dagster", "other")}  # fmt: skip
        total = sum(per_host.values())
        lines.append(
            f"| {name} | {fixed:.2f} | {slope * 1000:.1f} ms | {intervals} ms | {_num(k)} "
            f"| {' / '.join(_num(r) for r in by_sample)} "
            f"| {' / '.join(f'{c:.2f}' for c in cpu)} | {' / '.join(f'{c.wall:.1f}' for c in cells)} "
            f"| {' / '.join(str(c.usage.peak_pss >> 20) for c in cells)} "
            f"| {' / '.join(str(c.usage.peak_sessions) for c in cells)} "
            f"| {' / '.join(str(c.usage.peak_threads) for c in cells)} "
            f"| {' / '.join(str(c.usage.peak_fds) for c in cells)} "
            f"| {_kb(total)} ({_kb(per_host['logs'])} + {_kb(per_host['dagster'])} + {_kb(per_host['other'])}) "
            f"| {' / '.join(_num(c.window) for c in cells) if cells[-1].window is not None else ''} |"
        )
    lines += ["", f"Generated artifacts at {', '.join(map(str, sizes))} hosts (per-host files grouped as one kind; "
              "exponent: least squares of log bytes against log hosts; per file: the kind's exponent less its "
              "file count's).", "",
              "| artifact | files | bytes | exponent (total) | exponent (per file) |",
              "|---|---|---|---|---|"]  # fmt: skip
    kinds = sorted({kind for scale in scales.values() for kind in scale.artifacts})
    for kind in kinds:
        found = [scales[size].artifacts.get(kind, (0, 0)) for size in sizes]
        total = log_exponent(sizes, [b for _, b in found])
        count = log_exponent(sizes, [f for f, _ in found])
        per_file = None if total is None or count is None else total - count
        lines.append(f"| {kind} | {' / '.join(str(f) for f, _ in found)} | {' / '.join(_size(b) for _, b in found)} "
                     f"| {_num(total)} | {_num(per_file)} |")  # fmt: skip
    return "\n".join(lines)


def rtt_table(walls: dict[str, dict[float, float]], latency_ms: float, hosts: int) -> str:
    rtt = 2 * latency_ms / 1000
    lines = [f"Round trips on {hosts} hosts behind a relay adding {latency_ms:g} ms each way (RTT {rtt * 1000:g} "
             "ms): (wall at L - wall at 0) / RTT, hosts in parallel.", "",
             "| command | wall s at 0 | wall s at L | round trips |", "|---|---|---|---|"]  # fmt: skip
    latency = latency_ms / 1000
    for name, by_latency in walls.items():
        zero, slow = by_latency[0.0], by_latency[latency]
        lines.append(f"| {name} | {zero:.2f} | {slow:.2f} | {(slow - zero) / rtt:.1f} |")
    return "\n".join(lines)


def ui_table(found: dict[int, tuple[Backfill, Cell]]) -> str:
    sizes = sorted(found)
    small, large = sizes[0], sizes[-1]
    lines = [f"The UI's install (a backfill of host_installation over every host) beside the CLI's first install, "
             f"at {', '.join(map(str, sizes))} hosts.", "",
             "| install | runs | CPU s | CPU s/host | wall s | Dagster storage KB/host |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    ui = [found[n][0] for n in sizes]
    cli = [found[n][1] for n in sizes]
    span = large - small
    lines.append(f"| UI backfill | {' / '.join(str(b.runs) for b in ui)} | {' / '.join(f'{b.cpu:.2f}' for b in ui)} "
                 f"| {(ui[-1].cpu - ui[0].cpu) / span:.2f} | {' / '.join(f'{b.wall:.1f}' for b in ui)} "
                 f"| {(ui[-1].storage - ui[0].storage) / span / 1024:.1f} |")  # fmt: skip
    lines.append(f"| CLI install (first) | 1 | {' / '.join(f'{c.cpu:.2f}' for c in cli)} "
                 f"| {(cli[-1].cpu - cli[0].cpu) / span:.2f} | {' / '.join(f'{c.wall:.1f}' for c in cli)} "
                 f"| {(cli[-1].written['dagster'] - cli[0].written['dagster']) / span / 1024:.1f} |")  # fmt: skip
    return "\n".join(lines)


def _kb(value: float) -> str:
    return f"{value / 1024:.1f} KB"


def _size(value: int) -> str:
    return f"{value / 1024:.1f} KB" if value < 1 << 20 else f"{value / (1 << 20):.2f} MB"


def _sizes(text: str) -> list[int]:
    sizes = sorted(int(s) for s in text.split(","))
    if len(sizes) < 2 or sizes[0] < 2 or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError("two or more distinct sizes of 2 hosts or more, e.g. 25,80,250")
    return sizes


def _parts(text: str) -> set[str]:
    parts = set(text.split(","))
    if not parts <= PARTS:
        raise argparse.ArgumentTypeError(f"parts are {', '.join(sorted(PARTS))}")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=_sizes, default=[25, 80, 250])
    parser.add_argument("--max-parallel", type=int, default=None, help="passed to install/rollback (default: theirs)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the scale runs; each cell keeps its least CPU")
    parser.add_argument("--hosts-share", choices=["lowest", "default"], default="lowest",
                        help="the simulated hosts' CPU share in the scale runs (default: lowest, see the docstring)")
    parser.add_argument("--rtt-hosts", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--rtt-repeat", type=int, default=2)
    parser.add_argument("--ui-sizes", type=_sizes, default=[2, 8])
    parser.add_argument("--skip", type=_parts, default=set(), metavar="scale,rtt,ui", help="parts not to run")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables to FILE")
    args = parser.parse_args()
    began = time.monotonic()
    sections = []
    with tempfile.TemporaryDirectory(prefix="narwhal-bench-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o711)
        if "scale" not in args.skip:
            scales, fleet_line = run_scale(args.sizes, args.max_parallel, args.repeat, workdir, args.hosts_share)
            sections += [fleet_line, scale_tables(scales)]
        if "rtt" not in args.skip:
            walls = run_rtt(args.rtt_hosts, args.latency_ms, args.rtt_repeat, args.max_parallel, workdir)
            sections.append(rtt_table(walls, args.latency_ms, args.rtt_hosts))
        if "ui" not in args.skip:
            sections.append(ui_table(run_ui(args.ui_sizes, args.max_parallel, workdir)))
    header = (f"bench_fleet_scale: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end, "
              f"{(time.monotonic() - began) / 60:.1f} min")  # fmt: skip
    text = "\n\n".join([header, *sections]) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

"""How `prepare` and the files it reads and writes grow with the fleet: pure code on synthetic inventories.

No fleet and no SSH: for each size N (default 60, 125 and 250 hosts, one engine each, the router beside
engine-1) the script writes a checkout (a one-commit git repository, `.env` with `user@198.18.x.y`
destinations, a known-hosts store pinning every host), builds the discovered config set from synthetic
observations exactly as discovery does (`generate_config`) and publishes it (`publish_config`), then runs
`prepare` (every check, the credential guard, the role files, the bundle, the manifest) and the check
`install` makes of a prepared run (`stale_settings`). It prints, per size, the workstation CPU of each step
(this process plus its children: git), the size of every generated file and run directory, and then the
fitted exponent of each (log-log least squares over the sizes) and prepare's CPU per extra host (the slope
between the two largest sizes). Printed, never asserted:

    .venv/bin/python benchmarks/bench_prepare_scale.py [--sizes 60 125 250] [--repeat 3]
"""

from __future__ import annotations

import argparse
import base64
import math
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal_assets.core.discovery.observations import (
    Gpu,
    HostObservation,
    ImageObservation,
    ModelObservation,
    NetAddress,
    NetInterface,
)
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.workflows.discover import DiscoveryRun, generate_config, new_run_dir, publish_config
from narwhal_assets.workflows.install import stale_settings
from narwhal_assets.workflows.prepare import prepare

IMAGE_ID = "sha256:" + "a" * 64
CONFIG_SHA = "c" * 64
MODEL_DIR = "/srv/models/bench"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}  # fmt: skip
PACKAGES = {"vllm": "0.11.0", "nixl": "0.6.1", "torch": "2.8.0"}


def address(n: int) -> str:
    """198.18.0.0/15 has room for 131,070 hosts: past one /24 on purpose."""
    return f"198.18.{n // 250}.{n % 250 + 1}"


def host_key_line(n: int) -> str:
    """A syntactically real ssh-ed25519 known-hosts line for host n (its blob: type string + 32 key bytes)."""
    key_type = b"ssh-ed25519"
    raw = len(key_type).to_bytes(4, "big") + key_type + (32).to_bytes(4, "big") + n.to_bytes(32, "big")
    return f"{address(n)} ssh-ed25519 {base64.b64encode(raw).decode()}"


def observation(n: int, roles: list[str]) -> HostObservation:
    gpus = [Gpu(index=i, uuid=f"GPU-{n:08d}-0000-0000-0000-{i:012d}", name="NVIDIA H200", memory_total_mib=143771,
                pci_bus_id=f"00000000:{0x19 + i:02X}:00.0") for i in range(8)]  # fmt: skip
    fabric = NetInterface(name="fab0", state="UP", speed_mbps=400000,
                          addresses=[NetAddress(family="inet", address=address(n), prefixlen=15)])  # fmt: skip
    image: dict[str, Any] = {"reference": "bench/engine:1", "id": IMAGE_ID}
    if "packages" in ImageObservation.model_fields:
        image["packages"] = PACKAGES
    engines = [role for role in roles if role.startswith("engine-")]
    config = {"max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    return HostObservation(
        host_id=f"node-{n}", roles=roles, observed_at="2026-01-01T00:00:00Z",
        host_key_fingerprint="SHA256:" + "k" * 43, hostname=f"gpu{n}", machine_id=f"{n:032x}",
        boot_id="b" * 32, os_release="Debian GNU/Linux 12", kernel="6.1.0", python="3.11.2", gpus=gpus,
        interfaces=[fabric], image=ImageObservation(**image),
        models={e: ModelObservation(model_dir=MODEL_DIR, config_sha256=CONFIG_SHA, tree_sha256="t" * 64,
                                    file_count=3, config=config) for e in engines},
    )  # fmt: skip


def write_checkout(root: Path, hosts: int) -> None:
    """`.env` for `hosts` engine hosts (router with engine-1), a git commit to deploy, the trust store."""
    root.mkdir(parents=True)
    lines = ["NARWHAL_ROUTER_SSH=bench@" + address(1)]
    lines += [f"NARWHAL_NODE_{n}_SSH=bench@{address(n)}" for n in range(1, hosts + 1)]
    lines += ["NARWHAL_ENGINE_IMAGE=" + IMAGE_ID, "NARWHAL_ENGINE_MODEL_NAME=bench", f"NARWHAL_MODEL_DIR={MODEL_DIR}",
              "NARWHAL_RUN_DIR=/var/tmp/narwhal-run", "NARWHAL_FABRIC_INTERFACE=fab0",
              "NARWHAL_ENGINE_API_KEY_ENV=NARWHAL_ENGINE_KEY", "NARWHAL_ENGINE_KEY=bench-engine-key-0123456789"]
    (root / "README").write_text("bench\n")
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True, env=GIT_ENV)
    subprocess.run(["git", "add", "README"], cwd=root, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-q", "-m", "bench"], cwd=root, check=True, env=GIT_ENV)
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, env=GIT_ENV,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    lines.append(f"NARWHAL_DEPLOYMENT_REVISION={revision}")
    (root / ".env").write_text("\n".join(lines) + "\n")
    (root / "config").mkdir(mode=0o700)
    (root / "config" / "ssh.known_hosts").write_text("".join(host_key_line(n) + "\n" for n in range(1, hosts + 1)))


def cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    start = cpu()
    result = step()
    return cpu() - start, result


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(hosts: int, workdir: Path) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds per step and bytes per artifact for one fleet size."""
    root = workdir / f"checkout-{hosts}"
    write_checkout(root, hosts)
    checkout = Checkout.open(root)
    settings, inventory = checkout.settings, checkout.inventory
    observations = {entry.id: observation(int(entry.id.split("-")[1]), list(entry.roles)) for entry in inventory.hosts}
    run = DiscoveryRun(new_run_dir(settings), observations=observations)
    times: dict[str, float] = {}
    times["generate_config"], generated = timed(lambda: generate_config(settings, inventory, run))
    times["publish_config"], _ = timed(lambda: publish_config(settings, inventory, run, generated))
    settings = Settings.load(root)
    times["prepare"], prepared = timed(lambda: prepare(settings, "runs/deployment-env/bench"))
    times["stale_settings"], _ = timed(lambda: stale_settings(settings, prepared))
    sizes = {str(path.relative_to(root)): path.stat().st_size for path in sorted((root / "config").iterdir())}
    for name in ("sources.json", "manifest.json"):
        sizes[f"<run>/{name}"] = (prepared.run_dir / name).stat().st_size
    engine_files = sorted(prepared.run_dir.glob("node-*/.env.engine-*"))
    sizes["<run>/<host>/.env.engine-<n> (all)"] = sum(p.stat().st_size for p in engine_files)
    sizes["<run>/<host>/engine-launch.engine-<n>.json (all)"] = sum(
        p.stat().st_size for p in prepared.run_dir.glob("node-*/engine-launch.engine-*.json"))
    sizes["<run>/ (excluding engine role files)"] = tree_bytes(prepared.run_dir) - sizes[
        "<run>/<host>/.env.engine-<n> (all)"]
    sizes["runs/discovery/<run>/"] = tree_bytes(run.run_dir)
    return times, sizes


def exponent(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) over log(x)."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y > 0]
    if len(points) < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[60, 125, 250])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the least CPU of each step is kept")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    times: dict[str, list[float]] = {}
    artifacts: dict[str, list[int]] = {}
    for hosts in sizes:
        best: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
            for attempt in range(args.repeat):
                step_times, step_sizes = measure(hosts, Path(tmp) / str(attempt))
                best = {k: min(v, best.get(k, v)) for k, v in step_times.items()}
        for step, seconds in best.items():
            times.setdefault(step, []).append(seconds)
        for name, size in step_sizes.items():
            artifacts.setdefault(name, []).append(size)
        print(f"{hosts:>5} hosts: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in best.items()), flush=True)
    print(f"\nworkstation CPU (this process and its children), sizes {sizes}:")
    for step, values in times.items():
        slope = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2]) if len(sizes) > 1 else float("nan")
        shown = " / ".join(f"{v:.3f} s" for v in values)
        print(f"  {step:<16} {shown:<32} exponent {exponent(sizes, values):5.2f}   {slope * 1000:7.2f} ms per "
              "extra host")
    print("\nartifact bytes:")
    for name, values in artifacts.items():
        shown = " / ".join(str(v) for v in values)
        print(f"  {name:<52} {shown:<34} exponent {exponent(sizes, [float(v) for v in values]):5.2f}")
    print(f"\n(measured {time.strftime('%Y-%m-%d %H:%M:%S')}; compare lines of one run, not runs of different days)")


if __name__ == "__main__":
    main()

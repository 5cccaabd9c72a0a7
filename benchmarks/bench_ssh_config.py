"""Resolving every host of a fleet through an SSH config that lists the whole fleet.

A fleet command resolves each host's destination several times; the config names every host, so parsing it
per resolve (what `paramiko.SSHConfig` alone does) makes each host cost time linear in the fleet. For each
fleet size this prints the time per resolve of `resolve_endpoint` (config parsed once per text, each alias
looked up once) and, as the same-script baseline, of parsing the same text and looking the alias up for
every resolve; "per-resolve ratio" is against the smallest size (about 1.0 when a host's cost does not grow
with the fleet).

    .venv/bin/python benchmarks/bench_ssh_config.py [--sizes 32,256,1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from narwhal_assets.ssh.destination import resolve_endpoint


def config_text(hosts: int) -> str:
    return "".join(f"Host h{n}\n  HostName 10.{n // 250}.{n % 250}.2\n  User svc\n  IdentityFile ~/.ssh/h{n}\n"
                   f"  IdentitiesOnly yes\n\n" for n in range(1, hosts + 1))  # fmt: skip


def per_resolve(hosts: int, rounds: int, resolve: Callable[[str], object]) -> float:
    """Seconds per resolve over `rounds` passes over every alias (a command resolves each host several times)."""
    started = time.perf_counter()
    for _ in range(rounds):
        for n in range(1, hosts + 1):
            resolve(f"h{n}")
    return (time.perf_counter() - started) / (rounds * hosts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32,256,1024")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"{'hosts':>6} {'ms/resolve':>11} {'per-resolve ratio':>18} {'parse each time ms':>19} {'x faster':>9}")
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for hosts in sizes:
            path = Path(tmp) / f"config-{hosts}"
            text = config_text(hosts)
            path.write_text(text)
            ours = per_resolve(hosts, args.rounds, lambda alias, path=path: resolve_endpoint(alias, path))
            plain = per_resolve(hosts, 1, lambda alias, text=text: paramiko.SSHConfig.from_text(text).lookup(alias))
            first = first or ours
            print(f"{hosts:>6} {ours * 1000:>11.3f} {ours / first:>18.2f} {plain * 1000:>19.3f} {plain / ours:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

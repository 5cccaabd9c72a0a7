"""What resolving a destination costs the workstation, per host, against `ssh -G` itself in the same run.

Destinations resolve through the workstation's own `ssh -G` (narwhal_assets/ssh/resolver.py), so the floor
of a first ("cold") resolution is one `ssh -G` call, whose cost grows with the config it parses; later
("warm") resolutions of the same destination come from the cache while the config files are unchanged. For
a config of 32 and of 1,000 `Host` blocks (each host with HostName, User, Port, IdentityFile; a bastion, a
tenth of the hosts behind it by ProxyJump, and `Host *` defaults), this prints the CPU per host (this
process plus its children) of:

- `ssh -G` alone, one call per host (the baseline);
- `resolve_endpoint`, cold: each host once, cache empty (`ssh -G` plus expanding and classifying the answer;
  a ProxyJump hop is resolved once and then served from the cache);
- `resolve_endpoint`, warm: the same hosts again, `--rounds` times;

and each as a ratio to the baseline. Targets: cold <= 10 ms, warm <= 1 ms per host at 1,000 blocks.

    .venv/bin/python benchmarks/bench_ssh_config.py [--sizes 32,1000] [--hosts 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from narwhal_assets.ssh import resolver
from narwhal_assets.ssh.destination import resolve_endpoint


def config_text(blocks: int) -> str:
    """A fleet's ssh config: a bastion, `blocks - 2` hosts (every tenth behind the bastion), `Host *`."""
    parts = ["Host bastion\n  HostName 127.0.100.1\n  User jump\n  IdentityFile ~/.ssh/jump\n\n"]
    for n in range(1, blocks - 1):
        jump = "  ProxyJump bastion\n" if n % 10 == 0 else ""
        parts.append(f"Host h{n}\n  HostName 10.{n // 250}.{n % 250}.2\n  User svc\n  Port {2200 + n % 100}\n"
                     f"  IdentityFile ~/.ssh/h{n}\n  IdentitiesOnly yes\n{jump}\n")  # fmt: skip
    parts.append("Host *\n  ServerAliveInterval 30\n  ConnectTimeout 5\n")
    return "".join(parts)


def cpu() -> float:
    """CPU seconds of this process and its children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def per_host(hosts: list[str], rounds: int, work: Callable[[str], object]) -> float:
    """CPU milliseconds per call of `work` over `rounds` passes over `hosts`."""
    began = cpu()
    for _ in range(rounds):
        for host in hosts:
            work(host)
    return (cpu() - began) * 1000 / (rounds * len(hosts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32,1000", help="Host blocks per config (default 32,1000)")
    parser.add_argument("--hosts", type=int, default=100, help="hosts resolved per size (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="warm passes (default 5)")
    args = parser.parse_args()
    print(f"{'blocks':>6} {'ssh -G ms/host':>15} {'cold ms/host':>13} {'cold/ssh -G':>12} {'warm ms/host':>13} "
          f"{'warm/ssh -G':>12}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        primer = Path(tmp) / "primer"
        primer.write_text("Host primer\n  HostName 127.0.0.1\n")
        for blocks in (int(size) for size in args.sizes.split(",")):
            path = Path(tmp) / f"config-{blocks}"
            path.write_text(config_text(blocks))
            hosts = [f"h{n}" for n in range(1, min(args.hosts, blocks - 2) + 1)]
            resolver.clear_cache()
            resolve_endpoint("primer", primer)  # the per-process costs (OpenSSH's defaults, paramiko's algorithms)
            baseline = per_host(hosts, 1, lambda host, path=path: subprocess.run(
                ["ssh", "-G", "-F", str(path), "--", host], capture_output=True, check=True))  # fmt: skip
            cold = per_host(hosts, 1, lambda host, path=path: resolve_endpoint(host, path))
            warm = per_host(hosts, args.rounds, lambda host, path=path: resolve_endpoint(host, path))
            print(f"{blocks:>6} {baseline:>15.2f} {cold:>13.2f} {cold / baseline:>12.2f} {warm:>13.3f} "
                  f"{warm / baseline:>12.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Checking every host of a fleet against a trust store that lists the whole fleet.

A fleet command checks each host's key (and reads its recorded keys and fingerprints) against
`config/ssh.known_hosts`, which holds one line per host plus whatever the operator added (here a few
wildcard and hashed lines). For each fleet size this prints the CPU time per host (other load on the
machine does not count) of `verify` + `keys_for` + `fingerprints` with the store parsed once per content
(what the commands do) and, as the same-script baseline, with the parse cache emptied before every host
(every host paying for the whole file); "per-host ratio" is against the smallest size.

    .venv/bin/python benchmarks/bench_known_hosts.py [--sizes 32,256,1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from narwhal_assets.ssh import trust
from narwhal_assets.ssh.trust import HostKey, KnownHostsStore, TrustMode

PATTERN_LINES = 4
HASHED_LINES = 8


def host_key(n: int) -> HostKey:
    """A well-formed Ed25519 public key, one per host."""
    name = b"ssh-ed25519"
    blob = len(name).to_bytes(4, "big") + name + (32).to_bytes(4, "big") + hashlib.sha256(b"%d" % n).digest()
    return HostKey("ssh-ed25519", base64.b64encode(blob).decode())


def store_text(hosts: int) -> str:
    lines = [f"h{n} {host_key(n).key_type} {host_key(n).blob_b64}\n" for n in range(1, hosts + 1)]
    lines += [f"*.pattern{n}.example,!bad.example {host_key(0).key_type} {host_key(0).blob_b64}\n"
              for n in range(PATTERN_LINES)]  # fmt: skip
    for n in range(HASHED_LINES):
        salt = os.urandom(20)
        digest = hmac.new(salt, f"hashed{n}".encode(), hashlib.sha1).digest()
        name = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
        lines.append(f"{name} {host_key(0).key_type} {host_key(0).blob_b64}\n")
    return "".join(lines)


def per_host(store: KnownHostsStore, hosts: int, rounds: int, before: Callable[[], None]) -> float:
    """CPU seconds per host of one strict check and the lookups a command makes for it."""
    started = time.process_time()
    for _ in range(rounds):
        for n in range(1, hosts + 1):
            before()
            store.verify(f"node-{n}", f"h{n}", 22, host_key(n), TrustMode.STRICT)
            store.keys_for(f"h{n}", 22)
            store.fingerprints(f"h{n}", 22)
    return (time.process_time() - started) / (rounds * hosts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32,256,1024")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"{'hosts':>6} {'ms/host':>9} {'per-host ratio':>15} {'parse per host ms':>18} {'x faster':>9}")
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for hosts in sizes:
            path = Path(tmp) / f"known_hosts-{hosts}"
            path.write_text(store_text(hosts))
            store = KnownHostsStore(path)
            ours = per_host(store, hosts, args.rounds, lambda: None)
            fresh = per_host(store, hosts, 1, trust._parsed.cache_clear)
            first = first or ours
            print(f"{hosts:>6} {ours * 1000:>9.3f} {ours / first:>15.2f} {fresh * 1000:>18.3f} {fresh / ours:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

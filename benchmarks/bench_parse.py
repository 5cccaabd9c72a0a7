"""Parsing hostile probe output: time per nvidia-smi row must not grow with the row count (linear parse).

Rows are valid and all identical (the worst case for duplicate detection, which used to compare every
pair: 20k rows 10 s, 40k rows 35 s). For each size it prints the parse time, the time per row, and that
per-row time as a ratio of the smallest size's (about 1.0 when linear, growing with N when quadratic),
and, as the same-script baseline, the ratio to `json.loads` of a document of the same size.
The largest size is what the transport's output limit lets through at most.

    .venv/bin/python benchmarks/bench_parse.py [--sizes 10000,20000,40000,80000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from narwhal_assets.protocols.probe_report import parse_nvidia_smi
from narwhal_assets.ssh.transport import DEFAULT_OUTPUT_LIMIT

ROW = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nvidia-smi-query-h200x8.csv").read_text()
ROW = ROW.splitlines()[0] + "\n"


def best_of(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    limit_rows = DEFAULT_OUTPUT_LIMIT // len(ROW)
    parser.add_argument("--sizes", default=f"10000,20000,40000,{limit_rows}")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    base_per_row = None
    print(f"{'rows':>8} {'MiB':>6} {'parse s':>9} {'us/row':>8} {'per-row ratio':>14} {'x json.loads':>13}")
    for rows in sizes:
        text = ROW * rows
        document = json.dumps({"stdout": text})
        parse_s = best_of(args.repeat, lambda text=text: parse_nvidia_smi(text))
        json_s = best_of(args.repeat, lambda document=document: json.loads(document))
        per_row = parse_s / rows
        base_per_row = base_per_row or per_row
        print(
            f"{rows:>8} {len(text) / (1 << 20):>6.1f} {parse_s:>9.3f} {per_row * 1e6:>8.2f} "
            f"{per_row / base_per_row:>14.2f} {parse_s / json_s:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

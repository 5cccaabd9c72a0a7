"""The verified source bundle against plain git doing the least it could.

Baseline, measured in the same run on the same repository: `git bundle create --all` in the checkout plus
one `git clone` of that bundle. Ours (`gitsource.create_bundle`) also fetches only the revision into a
temporary bare repository, runs `git bundle verify` and checks the clone's HEAD. Printed, never asserted;
the best of --repeat runs is kept.

    .venv/bin/python benchmarks/bench_prepare_bundle.py [--files 4000] [--large-mib 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from narwhal_assets.local.gitsource import create_bundle

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}  # fmt: skip


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=True).stdout


def make_repo(root: Path, files: int, large_mib: int) -> str:
    rng = random.Random(7)
    git(root, "init", "-q", "-b", "main")
    for i in range(files):
        path = root / f"pkg{i % 40}" / f"module_{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(rng.randbytes(2048).hex().encode())
    (root / "assets.bin").write_bytes(rng.randbytes(large_mib << 20))
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "bench")
    return git(root, "rev-parse", "HEAD").strip()


def best(repeat: int, run: Callable[[], None]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        repo = base / "repo"
        repo.mkdir()
        revision = make_repo(repo, args.files, args.large_mib)
        counter = iter(range(1_000_000))

        def plain() -> None:
            run = base / f"plain-{next(counter)}"
            run.mkdir()
            git(repo, "bundle", "create", "-q", str(run / "all.bundle"), "--all")
            git(run, "clone", "-q", str(run / "all.bundle"), "checkout")

        def ours() -> None:
            out = base / f"ours-{next(counter)}"
            out.mkdir(mode=0o700)
            create_bundle(repo, revision, out)

        baseline = best(args.repeat, plain)
        prepared = best(args.repeat, ours)
    print(f"repository: {args.files} files + {args.large_mib} MiB, 2 CPUs shared; best of {args.repeat}")
    print(f"plain git bundle create --all + clone: {baseline:.2f} s")
    print(f"create_bundle (fetch revision, bundle, verify, clone, HEAD check): {prepared:.2f} s")
    print(f"ratio ours / plain: {prepared / baseline:.2f}x")


if __name__ == "__main__":
    main()

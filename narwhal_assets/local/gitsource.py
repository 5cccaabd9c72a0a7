"""The approved source revision as a verified git bundle (docs/prepare.md, "Source bundle").

Only the commit is fetched (into a temporary bare repository inside the output directory), so no
untracked, ignored or uncommitted workstation file can reach a host. The bundle is verified, cloned into a
fresh checkout whose HEAD must be the revision, and only then linked into place; every temporary
directory is removed whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.core.prepared_run.manifest import BUNDLE_FILE
from narwhal_assets.core.prepared_run.prepare_inputs import REVISION, REVISION_FIX
from narwhal_assets.local.privatefiles import FILE_MODE

DEPLOYMENT_BRANCH = "deployment"
DEPLOYMENT_REF = f"refs/heads/{DEPLOYMENT_BRANCH}"
GIT_TIMEOUT_S = 600.0
MAX_TREE_BYTES = 64 << 20


def _git(args: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run git with no inherited GIT_* variables and no prompts; bounded in time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    try:
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT_S,
                              check=False)  # fmt: skip
    except FileNotFoundError:
        raise NarwhalError("git is not installed on this workstation") from None
    except subprocess.TimeoutExpired:
        raise NarwhalError(f"git {args[0]} did not finish within {GIT_TIMEOUT_S:.0f} s") from None


def _checked(args: Sequence[str], cwd: Path | None = None) -> bytes:
    done = _git(args, cwd)
    if done.returncode != 0:
        first = next((line for line in done.stderr.decode("utf-8", "replace").splitlines() if line.strip()), "")
        raise NarwhalError(f"git {args[0]} failed (exit {done.returncode}): {first[:300]}")
    return done.stdout


def resolve_commit(root: Path, revision: str) -> None:
    """The revision must name a commit of the management checkout (not a tree, tag object or unknown id)."""
    if _git(["rev-parse", "--git-dir"], root).returncode != 0:
        raise InputError([f"{root}: not a git checkout; prepare ships a commit of the management checkout"])
    done = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}"], root)
    if done.returncode != 0 or done.stdout.decode().strip() != revision:
        raise InputError([f"{REVISION}: {revision} is not a commit of the management checkout {root}; {REVISION_FIX}"])


def tree_paths(root: Path, revision: str) -> list[str]:
    """Every path in the revision's tree (what a clone of the bundle will contain)."""
    listing = _checked(["ls-tree", "-r", "-z", "--name-only", "--full-tree", revision], root)
    if len(listing) > MAX_TREE_BYTES:
        raise NarwhalError(f"the tree of {revision} lists more than {MAX_TREE_BYTES >> 20} MiB of paths")
    return [p.decode("utf-8", "surrogateescape") for p in listing.split(b"\0") if p]


def create_bundle(root: Path, revision: str, out: Path) -> Path:
    """Write `<out>/source.bundle` (0600) holding exactly `revision` as `refs/heads/deployment`, verified."""
    with _scratch(out) as scratch:
        repo = scratch / "source.git"
        _checked(["init", "--quiet", "--bare", str(repo)])
        # Protocol v2 (git's default since 2.26) serves a commit by id even when no ref points at it.
        _checked(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(root), f"{revision}:{DEPLOYMENT_REF}"],
                 repo)  # fmt: skip
        bundle = scratch / BUNDLE_FILE
        _checked(["bundle", "create", "--quiet", str(bundle), DEPLOYMENT_REF], repo)
        os.chmod(bundle, FILE_MODE)
        _checked(["bundle", "verify", "--quiet", str(bundle)], repo)
        head = _clone_head(bundle, scratch / "checkout")
        if head != revision:
            raise NarwhalError(f"{BUNDLE_FILE}: a clone is at {head}, not at {revision}")
        target = out / BUNDLE_FILE
        os.link(bundle, target)
    return target


def bundle_head(bundle: Path) -> str:
    """HEAD of a fresh clone of `bundle` (in a private temporary directory, removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="narwhal-bundle-check-") as tmp:
        return _clone_head(bundle, Path(tmp) / "checkout")


def _clone_head(bundle: Path, checkout: Path) -> str:
    _checked(["clone", "--quiet", "--branch", DEPLOYMENT_BRANCH, "--", str(bundle), str(checkout)])
    return _checked(["rev-parse", "HEAD"], checkout).decode().strip()


@contextlib.contextmanager
def _scratch(out: Path) -> Iterator[Path]:
    scratch = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

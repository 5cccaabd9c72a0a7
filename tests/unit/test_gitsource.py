"""The source bundle against real git repositories: exactly the commit, verified, nothing left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.local.gitsource import bundle_head, create_bundle, resolve_commit, tree_paths

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
pytestmark = needs_git


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(root), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("ignored.txt\n")
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("first\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    (root / "src" / "a.py").write_text("second\n")
    git(root, "commit", "-q", "-am", "two")
    (root / "src" / "a.py").write_text("uncommitted\n")
    (root / "untracked.txt").write_text("untracked\n")
    (root / "ignored.txt").write_text("ignored\n")
    return root


def test_bundle_holds_exactly_the_revision(repo: Path, tmp_path: Path) -> None:
    first = git(repo, "rev-parse", "HEAD~1")
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    bundle = create_bundle(repo, first, out)
    assert [p.name for p in out.iterdir()] == ["source.bundle"], "temporary directories were left behind"
    assert bundle.stat().st_mode & 0o777 == 0o600
    assert bundle_head(bundle) == first
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "-b", "deployment", str(bundle), str(clone)], check=True)
    assert (clone / "src" / "a.py").read_text() == "first\n"
    assert sorted(git(clone, "ls-files").splitlines()) == [".gitignore", "src/a.py"]
    assert git(clone, "log", "--format=%H") == first, "the bundle holds the revision's history only"
    assert git(clone, "for-each-ref", "--format=%(refname)", "refs/heads") == "refs/heads/deployment"


def test_a_failed_bundle_leaves_nothing(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(NarwhalError) as info:
        create_bundle(repo, "0" * 40, out)
    assert str(info.value).startswith("git fetch failed (exit ")
    assert list(out.iterdir()) == []


def test_revision_must_be_a_commit_of_the_checkout(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    resolve_commit(repo, head)
    for bad in ("0" * 40, git(repo, "rev-parse", "HEAD^{tree}"), git(repo, "rev-parse", "HEAD:src/a.py")):
        with pytest.raises(InputError) as info:
            resolve_commit(repo, bad)
        assert info.value.problems == [f"NARWHAL_DEPLOYMENT_REVISION: {bad} is not a commit of the management "
                                       f"checkout {repo}; set NARWHAL_DEPLOYMENT_REVISION=$(git rev-parse HEAD) "
                                       "(the full commit id to deploy)"]  # fmt: skip
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InputError) as info:
        resolve_commit(plain, head)
    assert info.value.problems == [f"{plain}: not a git checkout; prepare ships a commit of the management checkout"]


def test_tree_paths_lists_the_committed_tree_only(repo: Path) -> None:
    assert sorted(tree_paths(repo, git(repo, "rev-parse", "HEAD"))) == [".gitignore", "src/a.py"]


def test_bundle_head_of_a_damaged_bundle_fails(tmp_path: Path) -> None:
    damaged = tmp_path / "source.bundle"
    damaged.write_bytes(b"# v2 git bundle\nnot really\n")
    with pytest.raises(NarwhalError, match=r"^git clone failed \(exit \d+\)"):
        bundle_head(damaged)

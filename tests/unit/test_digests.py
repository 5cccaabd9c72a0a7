"""The tree digest equals the documented shell pipeline, and replica comparison names the first difference."""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.readme import model_tree_digest_command, tree_digest_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from narwhal_assets.core.discovery.digests import (
    _check_entry,
    compare_replicas,
    first_difference,
    model_tree_digest,
    tree_digest,
    tree_listing,
    verify_digest,
)
from narwhal_assets.core.discovery.observations import CheckpointDigest, CheckpointFile
from narwhal_assets.core.errors import InputError

SHELL_TREE_DIGEST = tree_digest_command()


def shell_tree_digest(root: Path) -> str:
    """The README's recompute command, run verbatim by bash in the directory."""
    out = subprocess.run(["bash", "-c", SHELL_TREE_DIGEST], cwd=root, capture_output=True, text=True, check=True)
    digest, dash = out.stdout.split()
    assert dash == "-"
    return digest


def files_of(root: Path) -> list[CheckpointFile]:
    """Hash a tree in the simplest possible way, independent of the probe."""
    return [
        CheckpointFile(
            path=p.relative_to(root).as_posix(),
            size=p.stat().st_size,
            sha256=hashlib.sha256(p.read_bytes()).hexdigest(),
            mtime_ns=p.stat().st_mtime_ns,
            inode=p.stat().st_ino,
        )
        for p in root.rglob("*")
        if p.is_file()
    ]


def write_tree(root: Path, contents: dict[str, bytes]) -> None:
    for rel, data in contents.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def cf(path: str, data: bytes = b"x") -> CheckpointFile:
    return CheckpointFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mtime_ns=1, inode=1)


def digest(engine: str, host: str, files: list[CheckpointFile]) -> CheckpointDigest:
    return CheckpointDigest(
        engine=engine,
        host_id=host,
        model_dir="/srv/models/m",
        files=files,
        tree_sha256=tree_digest(files),
        bytes_hashed=0,
        bytes_reused=0,
        files_reused=0,
    )


TRICKY = {
    "config.json": b'{"model_type": "llama"}\n',
    "a.b": b"dot sorts before slash",
    "a/b": b"slash",
    "B-upper": b"upper case sorts before lower in C",
    "b-lower": b"",
    "dir with space/file name.bin": b"\x00\x01" * 1000,
    "\u00e9t\u00e9/z\u00fcrich.txt": b"non-ascii sorts after ascii",
    "z/.hidden": b"hidden files count",
    "-z": b"a leading dash needs `sha256sum --`",
}


def test_tree_digest_matches_shell_pipeline_on_tricky_names(tmp_path: Path) -> None:
    write_tree(tmp_path, TRICKY)
    assert tree_digest(files_of(tmp_path)) == shell_tree_digest(tmp_path)


def readme_model_tree_digest(root: Path) -> str:
    """The README's `model_tree_sha256` program, run verbatim by bash in the directory."""
    done = subprocess.run(["bash", "-c", model_tree_digest_command()], cwd=root, capture_output=True, text=True,
                          check=True)  # fmt: skip
    return done.stdout.strip()


def test_model_tree_digest_is_the_documented_fleet_manifest_digest(tmp_path: Path) -> None:
    """Component order, not byte order: `a/b` sorts before `a.b` here (`a` < `a.b`), after it in the tree listing."""
    write_tree(tmp_path, TRICKY)
    files = files_of(tmp_path)
    assert model_tree_digest(files) == readme_model_tree_digest(tmp_path)
    assert model_tree_digest(files) == model_tree_digest(list(reversed(files)))
    rows = [{"path": "a/b", "sha256": cf("a/b").sha256, "size": 1}, {"path": "a.b", "sha256": cf("a.b").sha256,
                                                                      "size": 1}]  # fmt: skip
    expected = hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert model_tree_digest([cf("a.b"), cf("a/b")]) == expected


def test_hub_download_metadata_is_outside_both_documented_digests(tmp_path: Path) -> None:
    """Replicas fetched at different times carry different `.cache/huggingface/` files; the digests agree."""
    write_tree(tmp_path, {"config.json": b"{}", "w.bin": b"w", "tok/.cache/huggingface/x": b"kept: not at the top"})
    before = shell_tree_digest(tmp_path), readme_model_tree_digest(tmp_path)
    write_tree(tmp_path, {".cache/huggingface/download/w.bin.metadata": b"etag 2025-11-30", ".cache/other": b"kept"})
    after_other = shell_tree_digest(tmp_path), readme_model_tree_digest(tmp_path)
    (tmp_path / ".cache" / "other").unlink()
    assert before == (shell_tree_digest(tmp_path), readme_model_tree_digest(tmp_path))
    assert after_other[0] != before[0] and after_other[1] != before[1]
    kept = [f for f in files_of(tmp_path) if not f.path.startswith(".cache/huggingface/")]
    assert before == (tree_digest(kept), model_tree_digest(kept))


def test_tree_listing_is_sorted_by_utf8_bytes_whatever_the_input_order() -> None:
    files = [cf("b"), cf("a/b"), cf("a.b"), cf("\u00e9"), cf("Z")]
    listing = tree_listing(files).decode()
    assert [line.split("  ", 1)[1] for line in listing.splitlines()] == ["Z", "a.b", "a/b", "b", "\u00e9"]
    assert tree_digest(files) == tree_digest(list(reversed(files)))


def test_tree_digest_of_known_listing() -> None:
    sha = hashlib.sha256(b"x").hexdigest()
    expected = hashlib.sha256(f"{sha}  a\n{sha}  b/c\n".encode()).hexdigest()
    assert tree_digest([cf("b/c"), cf("a")]) == expected


@pytest.mark.parametrize("path", ["a\nb", "a\\b", "-", "/abs", "", "./a", "a//b", "a/"])
def test_tree_digest_refuses_paths_sha256sum_would_escape_or_that_are_not_normalised(path: str) -> None:
    with pytest.raises(ValueError, match="checkpoint path"):
        tree_digest([cf(path)])


def test_tree_digest_refuses_duplicates_and_bad_hashes() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        tree_digest([cf("a"), cf("a", b"y")])
    bad = CheckpointFile(path="a", size=1, sha256="ABC", mtime_ns=1, inode=1)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        tree_digest([bad])


segment = st.text(alphabet="abzAZ09 ._-\u00e9\u4e2d", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
rel_paths = st.lists(segment, min_size=1, max_size=3).map("/".join)


def _no_prefix_conflicts(paths: list[str]) -> bool:
    """A path cannot be both a file and a directory of another path."""
    return not any(other.startswith(p + "/") for p in paths for other in paths)


trees = st.dictionaries(rel_paths, st.binary(max_size=64), min_size=1, max_size=8).filter(
    lambda d: _no_prefix_conflicts(list(d)) and "-" not in d  # a top-level "-" is refused (sha256sum reads stdin)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contents=trees)
def test_tree_digest_equals_shell_pipeline_for_random_trees(contents: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tree(root, contents)
        assert tree_digest(files_of(root)) == shell_tree_digest(root)


def _refused(path: str) -> bool:
    try:
        _check_entry(path, cf(path).sha256)
    except ValueError:
        return True
    return False


def test_the_joined_check_refuses_exactly_what_the_per_entry_rule_refuses() -> None:
    """tree_listing checks a whole table on its joined text; it must agree with the per-entry rule on every
    short path over the characters that matter, alone and next to a clean one."""
    alphabet = "a./-\\\n"
    paths = ["".join(chars) for length in range(5) for chars in itertools.product(alphabet, repeat=length)]
    for path in paths:
        for table in ([cf(path)], [cf("ok"), cf(path)]):
            if _refused(path):
                with pytest.raises(ValueError, match="checkpoint path"):
                    tree_digest(table)
            else:
                tree_digest(table)


def test_compare_replicas_accepts_identical_trees() -> None:
    files = [cf("config.json"), cf("w.bin", b"w")]
    compare_replicas({"engine-1": digest("engine-1", "node-1", files), "engine-2": digest("engine-2", "node-2", files)})
    compare_replicas({"engine-1": digest("engine-1", "node-1", files)})


def test_compare_replicas_names_engines_and_first_differing_path() -> None:
    left = digest("engine-1", "node-1", [cf("config.json"), cf("b.bin", b"1"), cf("c.bin", b"1")])
    right = digest("engine-2", "node-2", [cf("config.json"), cf("b.bin", b"2"), cf("c.bin", b"2")])
    with pytest.raises(InputError) as caught:
        compare_replicas({"engine-2": right, "engine-1": left})
    assert caught.value.problems == [
        f"checkpoint replicas differ: engine-1 (node-1:/srv/models/m) tree {left.tree_sha256[:12]} vs "
        f"engine-2 (node-2:/srv/models/m) tree {right.tree_sha256[:12]}: first difference at 'b.bin' (content differs)"
    ]


def test_compare_replicas_counts_a_missing_path_as_a_difference() -> None:
    left = digest("engine-1", "node-1", [cf("config.json"), cf("z.bin")])
    right = digest("engine-2", "node-1", [cf("a.bin"), cf("config.json"), cf("z.bin")])
    assert first_difference(left, right) == ("a.bin", "missing on engine-1")
    assert first_difference(right, left) == ("a.bin", "missing on engine-1")
    with pytest.raises(InputError, match=r"first difference at 'a\.bin' \(missing on engine-1\)"):
        compare_replicas({"engine-1": left, "engine-2": right})


def test_compare_replicas_reports_every_differing_engine_at_once() -> None:
    same = [cf("config.json")]
    replicas = {
        "engine-1": digest("engine-1", "node-1", same),
        "engine-2": digest("engine-2", "node-2", same),
        "engine-3": digest("engine-3", "node-3", [*same, cf("extra")]),
        "engine-4": digest("engine-4", "node-4", [cf("config.json", b"other")]),
    }
    with pytest.raises(InputError) as caught:
        compare_replicas(replicas)
    assert len(caught.value.problems) == 2
    assert (
        "engine-3 (node-3" in caught.value.problems[0] and "'extra' (missing on engine-1)" in caught.value.problems[0]
    )
    assert (
        "engine-4 (node-4" in caught.value.problems[1] and "'config.json' (content differs)" in caught.value.problems[1]
    )


def test_verify_digest_detects_a_tree_sha256_that_does_not_follow_from_the_files() -> None:
    good = digest("engine-1", "node-1", [cf("config.json")])
    verify_digest(good)
    verify_digest(good.model_copy(update={"model_tree_sha256": model_tree_digest(good.files)}))
    forged = good.model_copy(update={"tree_sha256": "0" * 64})
    with pytest.raises(InputError, match="engine-1 on node-1: tree_sha256 does not match"):
        verify_digest(forged)
    with pytest.raises(InputError, match="engine-1 on node-1: model_tree_sha256 does not match"):
        verify_digest(good.model_copy(update={"model_tree_sha256": "0" * 64}))

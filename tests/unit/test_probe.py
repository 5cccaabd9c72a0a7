"""The probe, run exactly as over SSH (the guard, the framed script on stdin) against fake tools and a real tree.

The tree digest is checked against the documented shell pipeline run by bash; the hashing functions are
also exercised in-process, where a file can be changed mid-read and hash calls can be counted.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.host_program import run_host_program
from helpers.readme import tree_digest_command

from narwhal_assets.core.discovery.digests import model_tree_digest, tree_digest
from narwhal_assets.core.discovery.observations import CheckpointFile
from narwhal_assets.core.errors import InputError, ProbeOutputError
from narwhal_assets.host import probe as probe_module
from narwhal_assets.host import program_stream
from narwhal_assets.protocols.probe import previous_hashes, probe_params, probe_script, probe_source
from narwhal_assets.protocols.probe_report import parse_probe_output

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NVIDIA_FIXTURE = FIXTURES / "nvidia-smi-query-h200x8.csv"
IP_FIXTURE = FIXTURES / "ip-json-address.json"
DOCKER_FIXTURE = FIXTURES / "docker-image-inspect.json"
IMAGE = "registry.example.com/narwhal/engine:2026.11.1"
DOCKER_ID = json.loads(DOCKER_FIXTURE.read_text())[0]["Id"]
SHELL_TREE_DIGEST = tree_digest_command()
MIB = 1024 * 1024


def shell_tree_digest(root: Path) -> str:
    out = subprocess.run(["bash", "-c", SHELL_TREE_DIGEST], cwd=root, capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def write_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """Fake nvidia-smi, ip, docker and hostname printing the fixtures, and only for the exact argv expected."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    query = " ".join(probe_module.NVIDIA_SMI_ARGV[1:])
    write_tool(
        bin_dir, "nvidia-smi", f'[ "$*" = "{query}" ] && exec cat "{NVIDIA_FIXTURE}"\necho bad args >&2\nexit 2\n'
    )
    write_tool(bin_dir, "ip", f'[ "$*" = "-json address" ] && exec cat "{IP_FIXTURE}"\nexit 1\n')
    write_tool(
        bin_dir,
        "docker",
        f'[ "$*" = "image inspect {IMAGE}" ] && exec cat "{DOCKER_FIXTURE}"\n'
        f'[ "$1 $2 $3 $4 $8 $9 ${{10}}" = "run --rm --pull never python3 {DOCKER_ID} -c" ] && '
        "echo '{\"nixl\": \"0.6.1\", \"vllm\": \"0.11.0\"}' && exit 0\n"
        'echo "[]"\necho "Error response from daemon: No such image: $3" >&2\nexit 1\n',
    )
    write_tool(bin_dir, "hostname", "echo gpu-node-2\n")
    return bin_dir


@pytest.fixture
def sysfs(tmp_path: Path) -> dict[str, str]:
    """A fake /sys/class/net and /sys/class/infiniband: one active IB port with its netdev, one down."""
    net = tmp_path / "sys-net"
    for name, speed in (("eno1", "100000"), ("eno2", "-1"), ("ibp26s0", "400000"), ("lo", None)):
        (net / name).mkdir(parents=True)
        if speed is not None:
            (net / name / "speed").write_text(speed + "\n")
    ib = tmp_path / "sys-ib"
    for device, state, layer, rate in (
        ("mlx5_0", "4: ACTIVE", "InfiniBand", "400 Gb/sec (4X NDR)"),
        ("mlx5_1", "1: DOWN", "Ethernet", "100 Gb/sec (2X HDR)"),
    ):
        port = ib / device / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text(layer + "\n")
        (port / "rate").write_text(rate + "\n")
    (ib / "mlx5_0" / "device" / "net" / "ibp26s0").mkdir(parents=True)
    (ib / "mlx5_0" / "device" / "infiniband_verbs" / "uverbs0").mkdir(parents=True)
    # Character devices need no fakes to be listed: the workstation's own /dev has some (null, zero, ...).
    return {"sysfs_net": str(net), "sysfs_infiniband": str(ib), "dev_infiniband": "/dev"}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small checkpoint: several shards (one over the 4 MiB read chunk), nested and odd names, a file link."""
    root = tmp_path / "models" / "m"
    (root / "tokenizer").mkdir(parents=True)
    (root / "dir with space").mkdir()
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}\n')
    (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(9 * MIB + 17))
    (root / "model-00002-of-00002.safetensors").write_bytes(os.urandom(3 * MIB))
    (root / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "dir with space" / "\u00fcber.txt").write_text("non-ascii name")
    (root / "empty").write_bytes(b"")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(1000))
    (root / "linked.bin").symlink_to(outside)
    return root


def run_probe(params: dict[str, Any], bin_dir: Path) -> dict[str, Any]:
    """Exactly what the transport does: the guard with the framed script on stdin; stdout must be one JSON text."""
    env = {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    proc = run_host_program(program_stream(probe_script(params)), env, 120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert proc.stdout.count(b"\n") == 1
    return json.loads(proc.stdout)


def parse(doc: dict[str, Any], roles: list[str] | None = None, previous: Any = None) -> Any:
    raw = json.dumps(doc)
    return parse_probe_output("node-1", roles or ["engine-1"], "SHA256:key", raw, "2026-11-30T00:00:00Z", previous)


def test_probe_over_stdin_collects_every_fact_and_parses(
    fake_bin: Path, model_dir: Path, sysfs: dict[str, str]
) -> None:
    doc = run_probe({"image": IMAGE, "models": {"engine-1": str(model_dir)}, **sysfs}, fake_bin)

    assert doc["errors"] == []
    assert doc["tools"]["nvidia-smi"] == dict(doc["tools"]["nvidia-smi"], rc=0, stdout=NVIDIA_FIXTURE.read_text())
    assert [entry["argv"] for entry in doc["log"]] == [
        ["hostname"],
        ["uname", "-r"],
        probe_module.NVIDIA_SMI_ARGV,
        ["ip", "-json", "address"],
        ["docker", "image", "inspect", IMAGE],
        ["docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3", DOCKER_ID, "-c",
         probe_module.PACKAGES_PROGRAM, *probe_module.PACKAGES],
    ]
    assert all(set(e) == {"argv", "rc", "stdout", "stderr", "seconds"} for e in doc["log"])
    assert doc["link_speeds"] == {"eno1": 100000, "eno2": None, "ibp26s0": 400000, "lo": None}

    observation, digests, log = parse(doc, ["router", "engine-1"])
    assert observation.hostname == "gpu-node-2"
    assert [g.index for g in observation.gpus] == list(range(8))
    assert observation.image is not None and observation.image.id.startswith("sha256:5b3c1d0e")
    assert observation.interface("ibp26s0") is not None
    assert observation.interface("ibp26s0").speed_mbps == 400000  # type: ignore[union-attr]
    assert [(p.device, p.active, p.netdevs, p.verbs) for p in observation.rdma] == [
        ("mlx5_0", True, ["ibp26s0"], ["uverbs0"]),
        ("mlx5_1", False, [], []),
    ]
    assert "null" in observation.rdma_devices and "shm" not in observation.rdma_devices  # devices, not dirs
    assert observation.image.packages == {"nixl": "0.6.1", "vllm": "0.11.0"}
    digest = digests["engine-1"]
    assert digest.tree_sha256 == shell_tree_digest(model_dir)
    assert observation.models["engine-1"].tree_sha256 == digest.tree_sha256
    config_sha = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    assert observation.models["engine-1"].config_sha256 == config_sha
    assert [f.path for f in digest.files][:3] == ["config.json", "dir with space/\u00fcber.txt", "empty"]
    assert digest.files_reused == 0 and digest.bytes_hashed == sum(f.size for f in digest.files)
    assert log == doc["log"]


def test_the_image_is_not_run_again_for_the_packages_of_a_known_image_id(
    fake_bin: Path, model_dir: Path, sysfs: dict[str, str]
) -> None:
    known = {DOCKER_ID: {"vllm": "0.10.0", "nixl": "0.5.0"}}
    doc = run_probe({"image": IMAGE, "models": {"engine-1": str(model_dir)}, "known_packages": known, **sysfs},
                    fake_bin)  # fmt: skip
    assert [entry["argv"][:2] for entry in doc["log"]][-1] == ["docker", "image"]  # inspected, not run
    observation = parse(doc, ["engine-1"])[0]
    assert observation.image is not None and observation.image.packages == {"nixl": "0.5.0", "vllm": "0.10.0"}


def test_character_devices_are_device_nodes_only(tmp_path: Path) -> None:
    (tmp_path / "uverbs9").write_text("")  # a regular file named like a device
    (tmp_path / "link").symlink_to("/dev/null")
    assert probe_module.character_devices(str(tmp_path)) == []
    assert {"null", "zero"} <= set(probe_module.character_devices("/dev"))
    assert probe_module.character_devices(str(tmp_path / "absent")) == []


def test_symlink_to_a_file_is_followed(model_dir: Path) -> None:
    tree = probe_module.hash_tree(str(model_dir))
    linked = next(f for f in tree["files"] if f["path"] == "linked.bin")
    target = (model_dir / "linked.bin").resolve()
    assert linked["inode"] == target.stat().st_ino
    assert linked["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()
    assert tree["problems"] == []


def test_incremental_rehash_reuses_unchanged_files_over_the_wire(
    fake_bin: Path, model_dir: Path, sysfs: dict[str, str]
) -> None:
    models = {"engine-1": str(model_dir)}
    first = parse(run_probe({"models": models, **sysfs}, fake_bin))[1]
    total = sum(f.size for f in first["engine-1"].files)
    count = len(first["engine-1"].files)

    doc = run_probe({"models": models, "previous": previous_hashes(first), **sysfs}, fake_bin)
    assert doc["models"]["engine-1"]["unchanged"] and doc["models"]["engine-1"]["files"] == []
    unchanged = parse(doc, previous=first)[1]
    assert (unchanged["engine-1"].files_reused, unchanged["engine-1"].bytes_hashed) == (count, 0)
    assert unchanged["engine-1"].bytes_reused == total
    assert unchanged["engine-1"].files == first["engine-1"].files
    assert unchanged["engine-1"].tree_sha256 == first["engine-1"].tree_sha256
    assert unchanged["engine-1"].model_tree_sha256 == first["engine-1"].model_tree_sha256
    assert first["engine-1"].model_tree_sha256 == model_tree_digest(first["engine-1"].files)

    touched = model_dir / "model-00002-of-00002.safetensors"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = parse(run_probe({"models": models, "previous": previous_hashes(unchanged), **sysfs}, fake_bin))[1]
    assert (again["engine-1"].files_reused, again["engine-1"].bytes_hashed) == (count - 1, stat.st_size)
    assert again["engine-1"].tree_sha256 == first["engine-1"].tree_sha256

    full = {"models": models, "previous": previous_hashes(again), "full_hash": True, **sysfs}
    rehashed = parse(run_probe(full, fake_bin))[1]
    assert (rehashed["engine-1"].files_reused, rehashed["engine-1"].bytes_hashed) == (0, total)


def tree_sha256(tree: dict[str, Any]) -> str:
    return tree_digest(CheckpointFile.model_validate(f) for f in tree["files"])


def test_dot_files_and_dot_directories_are_hashed_like_find_does(model_dir: Path) -> None:
    """`find` skips no name, so neither may the probe: a skipped dot-file would change the tree digest."""
    (model_dir / ".hidden").write_bytes(b"hidden")
    (model_dir / "tokenizer" / ".cache").mkdir()
    (model_dir / "tokenizer" / ".cache" / "x").write_bytes(b"cached")
    tree = probe_module.hash_tree(str(model_dir))
    assert {".hidden", "tokenizer/.cache/x"} <= {f["path"] for f in tree["files"]}
    assert tree_sha256(tree) == shell_tree_digest(model_dir) and tree["problems"] == []


def test_hub_download_metadata_is_not_part_of_the_tree(model_dir: Path) -> None:
    """A replica fetched later has other `.cache/huggingface/` files: its digest must still agree."""
    before = probe_module.hash_tree(str(model_dir))
    hub = model_dir / ".cache" / "huggingface" / "download"
    hub.mkdir(parents=True)
    (hub / "model.safetensors.metadata").write_text("etag\n2025-11-30T10:00:00\n")
    after = probe_module.hash_tree(str(model_dir))
    assert [f["path"] for f in after["files"]] == [f["path"] for f in before["files"]]
    assert tree_sha256(after) == tree_sha256(before) == shell_tree_digest(model_dir)
    assert after["problems"] == []


def test_worker_processes_hash_many_small_files_like_sha256sum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "small"
    (root / "a" / "b").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    for number in range(150):
        (root / ("a" if number % 2 else "a/b") / f"f{number:03d}").write_bytes(os.urandom(number * 37))
    monkeypatch.setattr(probe_module, "BATCH_FILES", 7)
    in_workers = probe_module.hash_tree(str(root), workers=3)
    assert in_workers["problems"] == [] and len(in_workers["files"]) == 151
    assert tree_sha256(in_workers) == shell_tree_digest(root)
    assert in_workers["files"] == probe_module.hash_tree(str(root), workers=1)["files"]
    assert in_workers["bytes_hashed"] == sum(number * 37 for number in range(150)) + 2


def test_a_hashing_process_that_dies_fails_the_tree_naming_the_files_it_held(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = probe_module.examine

    def dying(path: str, *args: Any) -> Any:
        if path == str(model_dir / "empty"):
            os._exit(3)
        return original(path, *args)

    monkeypatch.setattr(probe_module, "examine", dying)
    monkeypatch.setattr(probe_module, "BATCH_FILES", 1)
    tree = probe_module.hash_tree(str(model_dir), workers=2)
    lost = f"{model_dir / 'empty'}: not hashed (hashing process exited with wait status {3 << 8})"
    assert lost in tree["problems"]
    assert all(p.endswith(f"not hashed (hashing process exited with wait status {3 << 8})") for p in tree["problems"])


def rows(tree: dict[str, Any]) -> dict[str, list[Any]]:
    """A hash_tree result as the `previous` rows the next probe receives."""
    return {f["path"]: [f["size"], f["mtime_ns"], f["inode"], f["sha256"]] for f in tree["files"]}


def test_changed_content_with_same_stat_is_only_caught_by_full_hash(model_dir: Path) -> None:
    """Documents the trade-off of incremental hashing: reuse trusts size+mtime_ns+inode."""
    first = probe_module.hash_tree(str(model_dir))
    previous = rows(first)
    shard = model_dir / "model-00002-of-00002.safetensors"
    stat = shard.stat()
    with shard.open("r+b") as handle:
        handle.write(b"\xff" * 16)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert probe_module.hash_tree(str(model_dir), previous)["unchanged"]
    full = probe_module.hash_tree(str(model_dir), previous, full=True)
    assert full["files"] != first["files"] and full["files_reused"] == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_a_file_replaced_with_the_same_size_and_mtime_is_rehashed(model_dir: Path, workers: int) -> None:
    """Reuse demands the same inode too: a download tool that renames a new copy into place is caught."""
    previous = rows(probe_module.hash_tree(str(model_dir)))
    target = model_dir / "tokenizer" / "tokenizer.json"
    stat = target.stat()
    replacement = target.with_name("tokenizer.json.part")
    replacement.write_text('{"version": "2.0"}')
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replacement.replace(target)
    tree = probe_module.hash_tree(str(model_dir), previous, workers=workers)
    assert (tree["files_reused"], tree["bytes_hashed"]) == (len(previous) - 1, stat.st_size)
    entry = next(f for f in tree["files"] if f["path"] == "tokenizer/tokenizer.json")
    assert entry["sha256"] == hashlib.sha256(b'{"version": "2.0"}').hexdigest() and entry["inode"] != stat.st_ino


def test_a_rehash_of_many_files_stats_them_in_threads_and_agrees_with_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Enough files for a threaded stat pass (forced: stats here are too fast to choose threads), every one
    changed but config.json (a file the stat pass skipped would pass as reused), so many that they are then
    hashed in worker processes."""
    root = tmp_path / "many"
    count = 2 * probe_module.STAT_FILES_PER_THREAD + probe_module.STAT_SAMPLE
    for number in range(count):
        (root / f"d{number % 7}").mkdir(parents=True, exist_ok=True)
        (root / f"d{number % 7}" / f"f{number}").write_bytes(b"%d" % number)
    (root / "config.json").write_text("{}")
    previous = rows(probe_module.hash_tree(str(root)))
    for number in range(count):
        (root / f"d{number % 7}" / f"f{number}").write_bytes(b"changed %d" % number)
    (root / "d0" / "f0").unlink()
    (root / "d1" / "added").write_bytes(b"added")
    stat_threads: set[str] = set()
    stat_range = probe_module.stat_range

    def recorded(*args: Any) -> Any:
        stat_threads.add(threading.current_thread().name)
        return stat_range(*args)

    monkeypatch.setattr(probe_module, "SLOW_STAT_S", 0.0)
    monkeypatch.setattr(probe_module, "stat_range", recorded)
    threaded = probe_module.hash_tree(str(root), previous, workers=2)
    assert len(stat_threads) == 3, stat_threads  # the sample in the probe's thread, the rest in two threads
    assert threaded == dict(probe_module.hash_tree(str(root), previous, workers=1), seconds=threaded["seconds"])
    assert (threaded["files_reused"], threaded["unchanged"], threaded["problems"]) == (1, False, [])
    hashes = {f["path"]: f["sha256"] for f in threaded["files"]}
    assert hashes["d3/f3"] == hashlib.sha256(b"changed 3").hexdigest() and "d0/f0" not in hashes


def test_a_model_dir_shared_by_engines_is_hashed_once(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = probe_module.hash_tree

    def counting(root: str, *args: Any) -> dict[str, Any]:
        calls.append(root)
        return original(root, *args)

    monkeypatch.setattr(probe_module, "hash_tree", counting)
    alias = model_dir.parent / "alias"
    alias.symlink_to(model_dir)
    probe = probe_module.Probe()
    params = probe_module._load_params({"models": {"engine-1": str(model_dir), "engine-2": str(alias)}})
    models = probe_module.collect_models(probe, params)
    assert calls == [str(model_dir)] and len(models["engine-1"]["files"]) == 7
    assert models["engine-1"]["files"] == models["engine-2"]["files"]
    assert models["engine-2"]["model_dir"] == str(alias)
    assert probe.errors == []


def test_an_unchanged_shared_dir_lists_rows_for_an_engine_whose_previous_table_differed(model_dir: Path) -> None:
    """`unchanged` promises the engine's own previous table; an engine that had another table gets the rows."""
    tree = probe_module.hash_tree(str(model_dir))
    rows_1 = rows(tree)
    rows_2 = {rel: row for rel, row in rows_1.items() if rel != "empty"}
    params = {"models": {"engine-1": str(model_dir), "engine-2": str(model_dir)}}
    params["previous"] = {"engine-1": rows_1, "engine-2": rows_2}
    models = probe_module.collect_models(probe_module.Probe(), probe_module._load_params(params))
    assert models["engine-1"]["unchanged"] and models["engine-1"]["files"] == []
    assert not models["engine-2"]["unchanged"] and models["engine-2"]["files"] == tree["files"]


def _symlink_to_dir(root: Path) -> Path:
    (root / "sub-link").symlink_to(root / "tokenizer")
    return root / "sub-link"


def _dangling(root: Path) -> Path:
    (root / "gone.bin").symlink_to(root / "missing-target")
    return root / "gone.bin"


def _fifo(root: Path) -> Path:
    os.mkfifo(root / "tokenizer" / "pipe")
    return root / "tokenizer" / "pipe"


def _socket(root: Path) -> Path:
    path = root / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    return path


def _loop(root: Path) -> Path:
    (root / "loop").symlink_to(root / "loop")
    return root / "loop"


def _newline(root: Path) -> Path:
    (root / "bad\nname").write_text("x")
    return root / "bad\nname"


def _backslash(root: Path) -> Path:
    (root / "bad\\name").write_text("x")
    return root / "bad\\name"


def _dash(root: Path) -> Path:
    (root / "-").write_text("x")
    return root / "-"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_symlink_to_dir, "symlink to a directory (not allowed in a checkpoint)"),
        (_dangling, "dangling symlink"),
        (_fifo, "not a regular file (fifo, socket or device)"),
        (_socket, "not a regular file (fifo, socket or device)"),
        (_loop, "symlink loop"),
        (_newline, "file name contains a newline or backslash"),
        (_backslash, "file name contains a newline or backslash"),
        (_dash, "a top-level file named '-' is read as stdin by sha256sum"),
    ],
)
def test_entries_the_digest_cannot_describe_are_errors_naming_the_path(model_dir: Path, make: Any, reason: str) -> None:
    bad = make(model_dir)
    tree = probe_module.hash_tree(str(model_dir))
    assert tree["problems"] == [f"{bad}: {reason}"]
    assert tree["files"] == [] and tree["bytes_hashed"] == 0


def test_tree_errors_are_reported_per_engine_and_fail_parsing(
    fake_bin: Path, model_dir: Path, sysfs: dict[str, str]
) -> None:
    bad = _symlink_to_dir(model_dir)
    doc = run_probe({"models": {"engine-1": str(model_dir), "engine-2": str(model_dir)}, **sysfs}, fake_bin)
    message = f"engine-1, engine-2: {bad}: symlink to a directory (not allowed in a checkpoint)"
    assert doc["errors"] == [{"tool": "checkpoint", "message": message}]
    assert doc["models"]["engine-1"]["ok"] is False
    assert doc["tools"]["nvidia-smi"]["rc"] == 0  # other facts still collected
    with pytest.raises(ProbeOutputError) as caught:
        parse(doc, ["engine-1", "engine-2"])
    assert caught.value.problems == [f"host node-1: checkpoint: {message}"]
    assert caught.value.command_log == doc["log"]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_file_changed_while_being_read_is_an_error(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Also through worker processes (one task per file here), which inherit the patched reader."""
    original = probe_module.digest_stream
    shard = model_dir / "model-00001-of-00002.safetensors"

    def write_during_read(fd: int, buffer: bytearray, size: int) -> tuple[str, int]:
        result = original(fd, buffer, size)
        if os.fstat(fd).st_ino == shard.stat().st_ino:
            with shard.open("ab") as writer:
                writer.write(b"appended by a concurrent download")
        return result

    monkeypatch.setattr(probe_module, "digest_stream", write_during_read)
    monkeypatch.setattr(probe_module, "BATCH_FILES", 1)
    tree = probe_module.hash_tree(str(model_dir), workers=workers)
    assert tree["problems"] == [f"{shard}: changed while being read"]


def test_a_new_file_that_fails_during_a_rehash_is_a_problem_not_a_reused_file(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = rows(probe_module.hash_tree(str(model_dir)))
    new = model_dir / "added.bin"
    new.write_bytes(b"new")
    original = probe_module.digest_stream

    def growing(fd: int, buffer: bytearray, size: int) -> tuple[str, int]:
        result = original(fd, buffer, size)
        if os.fstat(fd).st_ino == new.stat().st_ino:
            with new.open("ab") as writer:
                writer.write(b"more")
        return result

    monkeypatch.setattr(probe_module, "digest_stream", growing)
    for workers in (1, 2):
        tree = probe_module.hash_tree(str(model_dir), previous, workers=workers)
        assert tree["problems"] == [f"{new}: changed while being read"]
        assert "added.bin" not in [f["path"] for f in tree["files"]] and tree["files_reused"] == len(previous)


def test_missing_model_dir_and_missing_config_are_errors(tmp_path: Path) -> None:
    assert probe_module.hash_tree(str(tmp_path / "nope"))["problems"] == [f"{tmp_path / 'nope'}: no such directory"]
    (tmp_path / "w.bin").write_bytes(b"w")
    tree = probe_module.hash_tree(str(tmp_path))
    assert tree["problems"] == [f"{tmp_path / 'config.json'}: missing (the model configuration must be at the top)"]


def test_missing_tools_do_not_stop_the_probe(tmp_path: Path, sysfs: dict[str, str]) -> None:
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    write_tool(empty_bin, "docker", "echo 'docker: permission denied' >&2\nexit 1\n")
    doc = run_probe({"image": IMAGE, "models": {"engine-1": str(tmp_path / "absent")}, **sysfs}, empty_bin)
    assert doc["tools"]["nvidia-smi"]["rc"] == 127
    assert doc["tools"]["nvidia-smi"]["stderr"] == "nvidia-smi: command not found\n"
    assert doc["tools"]["docker"]["rc"] == 1
    assert doc["errors"] == [{"tool": "checkpoint", "message": f"engine-1: {tmp_path / 'absent'}: no such directory"}]
    assert doc["files"]["boot_id"]["text"]  # host facts still read


def test_a_crashing_collector_becomes_an_error_entry_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sysfs: dict[str, str]
) -> None:
    def boom(root: str) -> list[dict[str, Any]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(probe_module, "rdma_ports", boom)
    probe_module.main(json.dumps({"models": {}, **sysfs}))
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert captured.err == ""
    assert {"tool": "rdma", "message": "internal error: RuntimeError: boom"} in doc["errors"]
    assert doc["rdma"] == [] and doc["link_speeds"]["eno1"] == 100000


def test_unreadable_params_still_give_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    probe_module.main("{not json")
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"][0]["tool"] == "probe"
    assert doc["errors"][0]["message"].startswith("internal error: JSONDecodeError")


def test_log_entries_are_clipped_but_tool_output_is_kept_whole() -> None:
    probe = probe_module.Probe()
    result = probe.run("big", [sys.executable, "-c", "print('x' * 200000)"])
    assert len(result["stdout"]) == 200001
    assert len(probe.log[0]["stdout"]) < probe_module.LOG_LIMIT + 100
    assert probe.log[0]["stdout"].endswith("characters truncated in the log]\n")


def test_a_hanging_tool_times_out_as_exit_124() -> None:
    result = probe_module.Probe().run("sleep", ["sleep", "5"], timeout=0.2)
    assert result["rc"] == 124 and "timed out" in result["stderr"]


def test_probe_script_is_ascii_python38_source_ending_in_one_main_call(tmp_path: Path) -> None:
    script = probe_script({"image": IMAGE, "models": {"engine-1": "/srv/models/\u00fcber 'quoted'"}})
    script.encode("ascii")
    ast.parse(script, feature_version=(3, 8))
    last = script.rstrip("\n").splitlines()[-1]
    call = ast.parse(last).body[0].value  # type: ignore[attr-defined]
    params = json.loads(call.args[0].value)
    assert call.func.id == "main" and params["models"]["engine-1"] == "/srv/models/\u00fcber 'quoted'"
    assert script.startswith(probe_source().rstrip())
    assert params["full_hash"] is False and params["workers"] is None and params["previous"] == {}


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"image": "--privileged"}, "probe params: image must be an image reference"),
        ({"image": "a b"}, "probe params: image must be an image reference"),
        ({"models": {"engine-1": "relative/path"}}, "probe params: models.engine-1: the model directory must be"),
        ({"models": {"router": "/srv/m"}}, "probe params: models: 'router' is not an engine role"),
        ({"workers": 0}, "probe params: workers must be a positive integer or null"),
        ({"full_hash": "yes"}, "probe params: full_hash must be true or false"),
        ({"colour": 1}, "probe params: unknown key 'colour'"),
    ],
)
def test_probe_params_are_checked_on_the_workstation(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(InputError) as caught:
        probe_params(params)
    assert len(caught.value.problems) == 1 and caught.value.problems[0].startswith(problem)


def test_link_speed_treats_minus_one_missing_and_garbage_as_unknown(tmp_path: Path) -> None:
    for name, text in (("a", "25000\n"), ("b", "-1\n"), ("c", "fast\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(text)
    (tmp_path / "d").mkdir()
    assert probe_module.link_speeds(str(tmp_path)) == {"a": 25000, "b": None, "c": None, "d": None}
    assert probe_module.link_speeds(str(tmp_path / "absent")) == {}

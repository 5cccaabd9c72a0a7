"""Pure drift and watch logic, and the drift probe program run locally on real files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal_assets.core.discovery.drift import DriftSnapshot, FileStat, ModelStat, compare_host, fabric_addresses
from narwhal_assets.core.discovery.observations import (
    CheckpointDigest,
    CheckpointFile,
    Gpu,
    HostObservation,
    ImageObservation,
    ModelObservation,
    NetAddress,
    NetInterface,
)
from narwhal_assets.core.discovery.watch import host_diff, input_states, parse_duration, rediscovery_reasons
from narwhal_assets.core.errors import InputError
from narwhal_assets.host import drift_probe

FP = "SHA256:old"
IMAGE = "sha256:" + "a" * 64
CONFIG = "c" * 64
GPU = Gpu(index=0, uuid="GPU-1", name="NVIDIA H200", memory_total_mib=143771, pci_bus_id="00000000:19:00.0")
FAB = NetInterface(name="fab0", state="UP", addresses=[NetAddress(family="inet", address="198.18.1.2", prefixlen=24)])


def observation() -> HostObservation:
    return HostObservation(
        host_id="node-1", roles=["engine-1"], observed_at="2026-01-01T00:00:00Z", host_key_fingerprint=FP,
        hostname="h1", machine_id="0" * 32, boot_id="b", os_release="Debian", kernel="6", python="3.11",
        gpus=[GPU], interfaces=[FAB], image=ImageObservation(reference="engine:1", id=IMAGE),
        models={"engine-1": ModelObservation(model_dir="/m", config_sha256=CONFIG, tree_sha256="t", file_count=2)},
    )  # fmt: skip


def digest() -> CheckpointDigest:
    files = [CheckpointFile(path=p, size=1, sha256="0" * 64, mtime_ns=5, inode=i) for i, p in enumerate(["a", "b"])]
    return CheckpointDigest(engine="engine-1", host_id="node-1", model_dir="/m", files=files, tree_sha256="t",
                            bytes_hashed=2, bytes_reused=0, files_reused=0)  # fmt: skip


def snapshot(**changes: object) -> DriftSnapshot:
    files = {"a": FileStat(size=1, mtime_ns=5, inode=0), "b": FileStat(size=1, mtime_ns=5, inode=1)}
    base = {"host_id": "node-1", "host_key_fingerprint": FP, "machine_id": "0" * 32, "image_id": IMAGE, "gpus": [GPU],
            "fabric": {"fab0": ["198.18.1.2"]},
            "models": {"engine-1": ModelStat(model_dir="/m", config_sha256=CONFIG, files=files)}}  # fmt: skip
    return DriftSnapshot.model_validate({**base, **changes})


def kinds(snap: DriftSnapshot) -> list[tuple[str, str]]:
    return [(c.kind, c.detail) for c in compare_host(observation(), {"engine-1": digest()}, snap)]


def test_an_identical_snapshot_is_no_drift() -> None:
    assert kinds(snapshot()) == []


def test_each_watched_fact_is_drift_when_it_changes() -> None:
    assert kinds(snapshot(host_key_fingerprint="SHA256:new")) == [("host-key", "SHA256:old -> SHA256:new")]
    assert kinds(snapshot(image_id=None)) == [("image", f"{IMAGE} -> None")]
    assert kinds(snapshot(machine_id=None)) == [("machine-id", f"{'0' * 32} -> unreadable (another machine at "
                                                                "this address?)")]  # fmt: skip
    assert kinds(snapshot(gpus=[])) == [("gpus", "1 GPUs -> 0 GPUs")]
    moved = snapshot(gpus=[GPU.model_copy(update={"uuid": "GPU-2"})])
    assert kinds(moved) == [("gpus", "GPU 0 changed (uuid, name, memory or PCI bus id)")]
    assert kinds(snapshot(fabric={"fab0": ["198.18.9.9"]})) == [("fabric", "fab0: 198.18.1.2 -> 198.18.9.9")]
    files = {"a": FileStat(size=1, mtime_ns=6, inode=0), "c\x1b[2J": FileStat(size=1, mtime_ns=5, inode=2)}
    model = ModelStat(model_dir="/m", config_sha256="d" * 64, files=files)
    assert kinds(snapshot(models={"engine-1": model})) == [
        ("model-config", f"engine-1: config.json {CONFIG} -> {'d' * 64}"),
        ("checkpoint", "engine-1: 1 file(s) changed: a"),
        ("checkpoint", "engine-1: 1 file(s) added: c\\x1b[2J"),  # a hostile name, escaped
        ("checkpoint", "engine-1: 1 file(s) removed: b"),
    ]
    assert kinds(snapshot(models={})) == [("checkpoint", "engine-1: not probed")]


def test_fabric_addresses_use_global_addresses_of_the_named_interfaces_only() -> None:
    local = NetAddress(family="inet6", address="fe80::1", prefixlen=64, scope="link")
    iface = FAB.model_copy(update={"addresses": [*FAB.addresses, local]})
    assert fabric_addresses([iface], ["fab0", "ib0"]) == {"fab0": ["198.18.1.2"], "ib0": []}


def test_watch_reasons_host_diff_and_durations() -> None:
    hashes = {".env": "e1", "config/deployment.env": "d1", "inventory": None}
    states = input_states(hashes, {"config/deployment.env": "d1"})
    assert states == {".env": "e1", "config/deployment.env": "published", "inventory": "absent"}
    assert rediscovery_reasons(None, states, discovered=True) == []
    assert rediscovery_reasons(None, states, discovered=False) == ["no discovery has completed yet"]
    assert rediscovery_reasons({**states, ".env": "e0"}, states, discovered=True) == [".env changed"]
    assert rediscovery_reasons({**states, "config/deployment.env": "d0"}, states, discovered=True) == []
    assert rediscovery_reasons({**states, "ssh_config": "s1"}, states, discovered=True) == ["ssh_config changed"]
    diff = host_diff(["node-1", "node-9"], ["node-1", "node-3", "node-2"])
    assert (diff.added, diff.removed) == (["node-3", "node-2"], ["node-9"])
    assert [parse_duration("V", t) for t in ("90", "90s", "15m", "1h", "7d")] == [90, 90, 900, 3600, 604800]
    with pytest.raises(InputError, match=r"^V: expected a positive duration"):
        parse_duration("V", "0")


def test_the_drift_program_stats_files_and_hashes_only_config_json(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_bytes(b'{"a": 1}\n')
    (model / "sub" / "w.bin").write_bytes(b"x" * 10)
    (model / "w.link").symlink_to("sub/w.bin")
    (model / "gone").symlink_to("nowhere")
    os.mkfifo(model / "pipe")
    (model / ".cache" / "huggingface").mkdir(parents=True)  # hub download metadata: outside the tree digest
    (model / ".cache" / "huggingface" / "w.bin.metadata").write_bytes(b"etag")
    params = {"commands": {"echo": ["echo", "hi"], "missing": ["no-such-tool-xyz"]}, "models": {"engine-1": str(model)}}
    script = drift_probe.__loader__.get_source(drift_probe.__name__) + f"\nmain({json.dumps(json.dumps(params))})\n"
    done = subprocess.run([sys.executable, "-I", "-S", "-"], input=script.encode(), capture_output=True, check=True)
    doc = json.loads(done.stdout)
    assert doc["tools"]["echo"]["stdout"] == "hi\n" and doc["tools"]["missing"]["rc"] == 127
    entry = doc["models"]["engine-1"]
    assert entry["config_sha256"] == hashlib.sha256(b'{"a": 1}\n').hexdigest() and entry["bytes_read"] == 9
    info = (model / "sub" / "w.bin").stat()
    assert entry["files"]["sub/w.bin"] == entry["files"]["w.link"] == [10, info.st_mtime_ns, info.st_ino]
    assert set(entry["files"]) == {"config.json", "sub/w.bin", "w.link"}
    reasons = sorted(p.split(": ")[1] for p in entry["problems"])
    assert reasons == ["No such file or directory", "not a regular file or a symlink to one"]


def test_the_drift_program_stays_light_and_reports_a_failing_worker_without_a_traceback() -> None:
    params = {"commands": {"echo": ["echo", "hi"], "empty": []}, "models": {}}
    report = "import sys\nprint(sorted(m for m in ('typing', 'logging', 'concurrent.futures') if m in sys.modules))"
    script = (drift_probe.__loader__.get_source(drift_probe.__name__)
              + f"\nmain({json.dumps(json.dumps(params))})\n{report}\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-S", "-"], input=script.encode(), capture_output=True, check=True)
    document, loaded = done.stdout.decode().splitlines()
    assert loaded == "[]", "start-up is most of the probe's cost on every host at every tick"
    assert json.loads(document)["errors"][0].startswith("internal error: IndexError") and not done.stderr

"""`deploy-hosts discover` against real sshd hosts (issue: discovery), every file checked against the fleet's truth.

The model fleet (the `fleet` fixture, helpers.fleet_checkout): h1 (router + engine-1, key auth), h2 (engine-2,
PASSWORD auth), h3 (engine-3, key auth), each serving the same model at /srv/models/demo-model. Destinations are
sentinel ssh-config aliases so a leak of a destination value is detectable. Every test builds its own checkout;
tests that break a host (fake tool, stopped sshd, changed replica) restore it in `finally`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli, discover, failing_discover, run_dirs
from helpers.files import assert_nowhere, known_hosts_fingerprints, read_json, replaced_file, snapshot, source_env
from helpers.fleet_checkout import (
    DESTINATIONS,
    ENGINE_HOSTS,
    HOST_IDS,
    LINKS,
    MODEL,
    MODEL_CONFIG,
    MODEL_DIR,
    PASSWORD,
    ROLES,
    TOUCHED,
    WEIGHTS,
    make_checkout,
)
from helpers.readme import tree_digest_command

from narwhal_assets.local.checkout import Checkout
from narwhal_assets.local.checkpoint_store import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
TREE_SCRIPT = 'cd "$1" && ' + tree_digest_command().removesuffix(" | sha256sum")
GENERATED = ("deployment.env", "engine-launch.local.json", "engine-launch.sources.json", "fleet.json",
             "hosts.local.json", "ssh.known_hosts", "profiling-limits.json")  # fmt: skip


# --------------------------------------------------------------------------------------------- helpers


def sh(script: str, *args: str) -> str:
    """A fixed bash script with its arguments as $1.. (never interpolated into the script)."""
    done = subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True, check=True)
    return done.stdout


def independent_tree(directory: Path) -> tuple[dict[str, str], str]:
    """Per-file sha256 and the tree digest of a replica, computed with the real `sha256sum`."""
    listing = sh(TREE_SCRIPT, str(directory))
    files = {}
    for line in listing.splitlines():
        digest, path = line.split("  ", 1)
        files[path] = digest
    tree = sh(TREE_SCRIPT + " | sha256sum", str(directory)).split()[0]
    return files, tree


def latest_metadata(asset: str) -> dict[str, object]:
    with dg.DagsterInstance.get() as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey(asset))
        assert event is not None and event.asset_materialization is not None
        return {key: value.value for key, value in event.asset_materialization.metadata.items()}


def replica_size(fleet: SimFleet, name: str) -> tuple[int, int]:
    """(file count, byte count) of one replica as `find -L` sees it."""
    sizes = [p.stat().st_size for p in fleet.model_path(name, MODEL).rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


@contextmanager
def stopped(fleet: SimFleet, name: str) -> Iterator[None]:
    fleet.stop_host(name)
    try:
        yield
    finally:
        fleet.start_host(name)


NVIDIA_SMI_COMMAND = "$ nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits"
BAD_NVIDIA_SMI = b"#!/bin/sh\necho '0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H200'\n"


# --------------------------------------------------------------------------------------------- tests


def test_full_discovery_matches_the_fleets_truth(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    run = discover(checkout, capsys)
    config = checkout / "config"
    assert run.parent == checkout / "runs" / "discovery"

    # inventory: variable names only
    assert read_json(config / "hosts.local.json") == {"schema": "narwhal.hosts", "schema_version": 1, "hosts": [
        {"id": "node-1", "ssh_env": "NARWHAL_NODE_1_SSH", "password_env": None, "roles": ["router", "engine-1"]},
        {"id": "node-2", "ssh_env": "NARWHAL_NODE_2_SSH", "password_env": "NARWHAL_NODE_2_SSH_PASSWORD",
         "roles": ["engine-2"]},
        {"id": "node-3", "ssh_env": "NARWHAL_NODE_3_SSH", "password_env": None, "roles": ["engine-3"]},
    ]}  # fmt: skip
    assert_nowhere([PASSWORD, *DESTINATIONS.values()], [config, checkout / "runs", Path(os.environ["DAGSTER_HOME"])])

    # trust store: one entry per host, each key one the host really serves
    recorded = known_hosts_fingerprints(config / "ssh.known_hosts")
    assert set(recorded) == {fleet.host(name).address for name in HOST_IDS}
    for name in HOST_IDS:
        host = fleet.host(name)
        assert recorded[host.address] and recorded[host.address] <= set(host.host_key_fingerprints().values())

    # deployment.env, as bash reads it
    config_sha = hashlib.sha256(json.dumps(MODEL_CONFIG, indent=2, sort_keys=True).encode() + b"\n").hexdigest()
    assert config_sha == hashlib.sha256((fleet.model_path("h2", MODEL) / "config.json").read_bytes()).hexdigest()
    expected_env = {}
    for n, name in ENGINE_HOSTS.items():
        host = fleet.host(name)
        expected_env |= {
            f"NARWHAL_NODE_{n}_IP": host.fabric_address,
            f"NARWHAL_NODE_{n}_URL": f"http://{host.fabric_address}:8000",
            f"NARWHAL_NODE_{n}_ATTESTATION_URL": f"http://{host.fabric_address}:8001/v1/attestation",
            f"NARWHAL_NODE_{n}_ENGINE_IMAGE": host.image_id,
            f"NARWHAL_NODE_{n}_MODEL_CONFIG_SHA256": config_sha,
        }
    assert source_env(config / "deployment.env") == expected_env

    # fleet: iids, roles, whole-value references, model, hardware from the fake GPUs
    fleet_json = read_json(config / "fleet.json")
    assert fleet_json["schema"] == "narwhal.fleet" and fleet_json["model"] == MODEL
    assert fleet_json["hardware"] == {"accelerator": "NVIDIA H200", "accelerators_per_engine": 2, "tensor_parallel": 2}
    assert fleet_json["engines"] == [
        {"iid": f"n{n}", "url": f"${{NARWHAL_NODE_{n}_URL}}",
         "attestation_url": f"${{NARWHAL_NODE_{n}_ATTESTATION_URL}}", "role": "prefill" if n == 1 else "decode"}
        for n in ENGINE_HOSTS
    ]  # fmt: skip
    assert "engine" not in fleet_json
    assert read_json(config / "profiling-limits.json")["engines"] == {"n1": 8, "n2": 8, "n3": 8}

    # launch records
    launch = read_json(config / "engine-launch.local.json")
    assert launch["schema"] == "narwhal.engine-launch"
    assert set(launch["engines"]) == {"engine-1", "engine-2", "engine-3"}
    for n, name in ENGINE_HOSTS.items():
        entry, host = launch["engines"][f"engine-{n}"], fleet.host(name)
        assert entry["host_id"] == HOST_IDS[name]
        assert entry["gpu_ids"] == [str(g.index) for g in host.gpus]
        assert entry["tensor_parallel_size"] == len(host.gpus)
        assert entry["accelerator"] == host.gpus[0].name and entry["gpu_visibility_env"] == "CUDA_VISIBLE_DEVICES"
        assert entry["fabric_address"] == host.fabric_address and entry["network_mode"] == "host"
        assert entry["transfer"] == {"transport": "ucx_tcp", "net_devices": "fab0", "devices": [], "gpu_tls": "cuda"}
        # read inside the host's image by the probe (the fake docker runs the probe's program)
        assert entry["runtime"]["expected_packages"] == {"nixl": "0.6.1", "torch": "2.8.0", "vllm": "0.11.0"}
        assert [d for d in entry["accelerator_devices"] if re.fullmatch(r"/dev/nvidia[0-9]+", d)] == [
            f"/dev/nvidia{g.index}" for g in host.gpus
        ]
    sources = read_json(config / "engine-launch.sources.json")
    assert set(sources["engines"]) == set(launch["engines"]) and sources["shared"]["max_num_seqs"] == {
        "layer": "default"}

    # observations: exactly the fake tools' truth
    for name, host_id in HOST_IDS.items():
        host = fleet.host(name)
        obs = read_json(run / f"{host_id}.json")
        assert obs["host_id"] == host_id and obs["hostname"] == name
        assert obs["roles"] == [r for r, h in ROLES.items() if h == name]
        assert obs["host_key_fingerprint"] in host.host_key_fingerprints().values()
        assert [(g["index"], g["uuid"], g["name"], g["memory_total_mib"], g["pci_bus_id"]) for g in obs["gpus"]] == [
            (g.index, g.uuid, g.name, g.memory_mib, g.bus_id) for g in host.gpus
        ]
        assert re.fullmatch(r"[0-9a-f]{32}", obs["machine_id"]) and re.fullmatch(r"[0-9a-f-]{36}", obs["boot_id"])
        fab0 = next(i for i in obs["interfaces"] if i["name"] == "fab0")
        assert host.fabric_address in [a["address"] for a in fab0["addresses"]]
        assert obs["image"]["id"] == host.image_id and obs["image"]["reference"] == host.image_ref
        engine = next(r for r in obs["roles"] if r.startswith("engine-"))
        assert obs["models"][engine]["config_sha256"] == config_sha

    # checkpoint digests, recomputed on the workstation-side replicas with sha256sum
    for n, name in ENGINE_HOSTS.items():
        digest = load_checkpoint(run / f"engine-{n}-checkpoint.json").model_dump()
        files, tree = independent_tree(fleet.model_path(name, MODEL))
        assert set(files) == {*WEIGHTS, *LINKS, "config.json"}
        assert {f["path"]: f["sha256"] for f in digest["files"]} == files
        assert digest["tree_sha256"] == tree
        assert digest["engine"] == f"engine-{n}" and digest["host_id"] == HOST_IDS[name]
        assert digest["model_dir"] == MODEL_DIR
        assert digest["files_reused"] == 0 and digest["bytes_hashed"] == replica_size(fleet, name)[1]

    # logs: commands and exit statuses, no password
    for host_id in HOST_IDS.values():
        log = (run / "logs" / f"{host_id}.log").read_text(encoding="utf-8")
        docker = f"$ docker image inspect {fleet.host('h1').image_ref}"
        for command in (NVIDIA_SMI_COMMAND, "$ ip -json address", docker):
            assert command in log, f"{host_id}.log lacks {command!r}"
        assert re.search(r"^exit 0\b", log, re.MULTILINE) and PASSWORD not in log

    # private modes everywhere
    for top in (config, checkout / "runs"):
        for path in [top, *top.rglob("*")]:
            if path.is_relative_to(Path(os.environ["DAGSTER_HOME"])):
                continue
            expected = 0o700 if path.is_dir() else 0o600
            assert path.stat().st_mode & 0o777 == expected, f"{path} is {oct(path.stat().st_mode & 0o777)}"


def test_rediscovery_rehashes_only_the_touched_file_and_full_hash_rehashes_all(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    count, size = replica_size(fleet, "h1")
    discover(checkout, capsys)
    first = latest_metadata("checkpoint_digests")
    assert (first["bytes_hashed"], first["bytes_reused"], first["files_reused"]) == (3 * size, 0, 0)

    touched = fleet.model_path("h2", MODEL) / TOUCHED
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    run = discover(checkout, capsys)
    meta = latest_metadata("checkpoint_digests")
    touched_size = len(WEIGHTS[TOUCHED])
    assert meta["bytes_hashed"] == touched_size
    assert meta["bytes_reused"] == 3 * size - touched_size
    assert meta["files_reused"] == 3 * count - 1
    for n, name in ENGINE_HOSTS.items():
        digest = read_json(run / f"engine-{n}-checkpoint.json")
        expected = (touched_size, size - touched_size, count - 1) if name == "h2" else (0, size, count)
        assert (digest["bytes_hashed"], digest["bytes_reused"], digest["files_reused"]) == expected, name
        assert digest["tree_sha256"] == independent_tree(fleet.model_path(name, MODEL))[1]
    entry = next(f for f in load_checkpoint(run / "engine-2-checkpoint.json").files if f.path == TOUCHED)
    assert entry.mtime_ns == touched.stat().st_mtime_ns
    # per-file tables are stored once: only the touched replica's table is new
    assert len(list((run.parent / "objects").iterdir())) == len(ENGINE_HOSTS) + 1

    run = discover(checkout, capsys, "--full-hash")
    meta = latest_metadata("checkpoint_digests")
    assert (meta["bytes_hashed"], meta["bytes_reused"], meta["files_reused"]) == (3 * size, 0, 0)
    for n in ENGINE_HOSTS:
        digest = read_json(run / f"engine-{n}-checkpoint.json")
        assert (digest["bytes_hashed"], digest["files_reused"]) == (size, 0)
    assert len(list((run.parent / "objects").iterdir())) == len(ENGINE_HOSTS) + 1  # same tables as before

    # retention: older complete runs go after the publish; this run's tables still load
    monkeypatch.setenv("NARWHAL_DISCOVERY_KEEP_RUNS", "1")
    run = discover(checkout, capsys)
    assert run_dirs(checkout) == [run] and (run / "previous-config").is_dir()
    assert all(load_checkpoint(run / f"engine-{n}-checkpoint.json").files for n in ENGINE_HOSTS)


def test_a_replica_that_differs_fails_discovery_naming_engines_and_first_path(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    before = snapshot(checkout / "config")
    replica = fleet.model_path("h3", MODEL)
    # Two files differ; the error names the first in byte order, and the same-size edit is not a size check.
    with (
        replaced_file(replica / "tokenizer" / "special tokens.txt", b"<S>\n</S>\n"),
        replaced_file(replica / TOUCHED, bytes(b ^ 0xFF for b in WEIGHTS[TOUCHED])),
    ):
        err, run = failing_discover(checkout, capsys)
    assert "checkpoint replicas differ" in err
    assert "engine-1" in err and "engine-3" in err and "engine-2" not in err
    assert f"first difference at '{TOUCHED}'" in err and "special tokens" not in err
    assert snapshot(checkout / "config") == before
    assert run is not None and not (run / "manifest.json").exists()


def test_malformed_nvidia_smi_names_host_and_tool_and_replaces_nothing(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    before = snapshot(checkout / "config")
    with replaced_file(fleet.host("h2").hostdir / "bin" / "nvidia-smi", BAD_NVIDIA_SMI):
        err, run = failing_discover(checkout, capsys, rc=1)  # what a host prints is a host failure, not input
    assert re.search(r"host node-2: nvidia-smi: line 1: expected 5 comma-separated fields, got 3", err), err
    assert "node-1" not in err and "node-3" not in err
    assert snapshot(checkout / "config") == before
    assert run is not None and not (run / "manifest.json").exists()
    assert "GPU-00000000-0000-0000-0000-000000000000" in (run / "logs" / "node-2.log").read_text()


def test_unreachable_and_failing_hosts_are_reported_together_and_enrol_nothing(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    Checkout.open(checkout).save_inventory()
    before = snapshot(checkout / "config")
    assert set(before) == {"hosts.local.json"}
    with stopped(fleet, "h3"), replaced_file(fleet.host("h2").hostdir / "bin" / "nvidia-smi", BAD_NVIDIA_SMI):
        err, run = failing_discover(checkout, capsys, rc=1)  # an unreachable host is not bad input
    assert "node-3" in err and "refused" in err
    assert "node-2" in err and "nvidia-smi" in err
    assert snapshot(checkout / "config") == before, "a failed discovery enrolled a host key or wrote config"
    assert run is not None and not (run / "manifest.json").exists()
    assert read_json(run / "node-1.json")["gpus"] and read_json(run / "engine-1-checkpoint.json")["tree_sha256"]
    assert "$ nvidia-smi" in (run / "logs" / "node-1.log").read_text()
    assert "$ nvidia-smi" in (run / "logs" / "node-2.log").read_text()
    assert not (run / "node-2.json").exists() and not (run / "node-3.json").exists()
    rc, _, err = cli(checkout, "check-access", "--host", "node-1", capsys=capsys)
    assert rc != 0 and "is not in" in err, "the reachable host must not have been enrolled"


def test_second_discovery_archives_the_previous_set_and_the_manifest_lists_every_file(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    config = checkout / "config"
    first = discover(checkout, capsys)
    assert not snapshot(first / "previous-config"), "a first discovery has no previous set to archive"
    assert_manifest(first, checkout)

    # The operator drops h3's entry (to re-verify it); the archive must hold the file as it was then.
    known = config / "ssh.known_hosts"
    h3 = fleet.host("h3").address
    known.write_text("".join(line for line in known.read_text().splitlines(keepends=True)
                             if not line.startswith(h3 + " ")))  # fmt: skip
    before = {name: data for name, data in snapshot(config).items() if not name.endswith(".lock")}
    assert set(before) == set(GENERATED)

    second = discover(checkout, capsys)
    assert snapshot(second / "previous-config") == before
    assert h3 + " " in known.read_text()
    assert_manifest(second, checkout)


def assert_manifest(run: Path, root: Path) -> None:
    manifest = read_json(run / "manifest.json")
    assert manifest["schema"] == "narwhal.discovery-manifest"
    files = {p for p in (root / "config").iterdir() if p.is_file() and not p.name.endswith(".lock")}
    assert set(manifest["files"]) == {f"config/{p.name}" for p in files}
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == digest, rel


def test_dagster_cli_materialize_generates_the_same_files(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's Dagster commands, exactly: from the repository (no .env there), `NARWHAL_ROOT` naming the
    checkout, quiet console; `dg launch` and `dagster asset materialize` both regenerate the same files."""
    config = checkout / "config"
    first = discover(checkout, capsys)
    by_command = {name: (config / name).read_text() for name in GENERATED}
    bin_dir = Path(sys.executable).parent
    quiet = '{"loggers": {"console": {"config": {"log_level": "WARNING"}}}}'
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")} | {"NARWHAL_ROOT": str(checkout)}
    commands = [
        [str(bin_dir / "dg"), "launch", "--job", "discovery_job", "--config-json", quiet],
        [str(bin_dir / "dg"), "launch", "--assets", "*profiling_limits", "--config-json", quiet],
        [str(bin_dir / "dagster"), "asset", "materialize", "-m", "narwhal_assets.definitions",
         "--select", "*profiling_limits", "--config-json", quiet],
    ]  # fmt: skip
    seen = {first}
    for command in commands:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        # Steps run in the run's own process (no step-worker lines), and the quiet config hides the rest.
        debug = [line for line in (done.stdout + done.stderr).splitlines() if " - DEBUG - " in line]
        assert debug == [], debug
        assert "BetaWarning" not in done.stderr
        later = [run for run in run_dirs(checkout) if run not in seen]
        assert len(later) == 1 and (later[0] / "manifest.json").exists(), command
        seen.add(later[0])
        for name in GENERATED:
            assert (config / name).read_text().replace(str(later[0]), str(first)) == by_command[name], name


@pytest.mark.parametrize(
    ("case", "roles", "extra", "rc", "expected"),
    [
        # The hosts answered that they lack the image: each of them failed (exit 1), naming it.
        ("image", ROLES, {"NARWHAL_ENGINE_IMAGE": "narwhal/inference-engine:no-such-tag"}, 1,
         [r"host node-1: docker image inspect: .*No such image: narwhal/inference-engine:no-such-tag",
          r"host node-2: docker", r"host node-3: docker"]),
        ("pin", ROLES, {"NARWHAL_MODEL_CONFIG_SHA256": "0" * 64}, 2,
         [r"host node-1: engine-1 config.json SHA-256 .* NARWHAL_MODEL_CONFIG_SHA256", r"host node-3: engine-3"]),
        ("fabric", ROLES, {"NARWHAL_FABRIC_INTERFACE": "nosuch0"}, 2,
         [r"host node-2: fabric interface 'nosuch0' \(NARWHAL_FABRIC_INTERFACE\) not found"]),
        ("one-engine", {"router": "h1", "engine-1": "h1"}, {}, 2,
         [r"hosts.local.json: hosts: the fleet needs at least two engines .*found 1"]),
        # A fabric address on no host would reach every role file while the launch records keep the real one.
        ("node-ip", ROLES, {"NARWHAL_NODE_1_IP": "203.0.113.77"}, 2,
         [r"NARWHAL_NODE_1_IP is not a global address of host node-1's fabric interface 'fab0'"]),
        ("attestation-url", ROLES, {"NARWHAL_NODE_1_ATTESTATION_URL": "http://engine-1.invalid:8001/wrong"}, 2,
         [r"NARWHAL_NODE_1_ATTESTATION_URL must be an HTTP service URL http://HOST:PORT/v1/attestation"]),
    ],
)  # fmt: skip
def test_discovery_rejects_bad_inputs_and_writes_nothing(
    tmp_path: Path, fleet: SimFleet, ssh_config: Path, capsys: pytest.CaptureFixture[str],
    case: str, roles: dict[str, str], extra: dict[str, str], rc: int, expected: list[str],
) -> None:  # fmt: skip
    root = make_checkout(tmp_path / case, fleet, ssh_config, roles, **extra)
    Checkout.open(root).save_inventory()
    before = snapshot(root / "config")
    err, _ = failing_discover(root, capsys, rc)
    for pattern in expected:
        assert re.search(pattern, err), f"{pattern!r} not in:\n{err}"
    assert snapshot(root / "config") == before, "a rejected discovery enrolled a host key or wrote config"


def test_concurrent_discoveries_each_publish_their_own_observations_as_named_runs(
    checkout: Path, fleet: SimFleet
) -> None:
    """Two `deploy-hosts discover` processes on one checkout and one instance: each run's `discovered_config`
    publishes that run's observations (the source index names its own run directory), the second publisher
    archives exactly the first one's set, and `config/` ends as one complete set (the later manifest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    command = [sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "discover"]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    runs = [Path(re.search(r"^discovery run (\S+)$", out, re.MULTILINE).group(1)) for out, _ in outputs]
    first, second = sorted(runs, key=lambda run: (run / "manifest.json").stat().st_mtime_ns)
    config = checkout / "config"
    sources = "engine-launch.sources.json"
    assert str(second) in (config / sources).read_text() and str(first) not in (config / sources).read_text()
    archived = (second / "previous-config" / sources).read_text()
    assert str(first) in archived and str(second) not in archived
    assert_manifest(second, checkout)
    first_set = read_json(first / "manifest.json")["files"]
    for rel, digest in first_set.items():
        archived_file = second / "previous-config" / Path(rel).name
        assert hashlib.sha256(archived_file.read_bytes()).hexdigest() == digest, rel

    # Both runs are the named job, tagged with the command that started them, in the shared instance.
    with dg.DagsterInstance.get() as instance:
        records = instance.get_run_records()
    assert len(records) == 2
    assert {r.dagster_run.job_name for r in records} == {"discovery_job"}
    assert {r.dagster_run.tags.get("narwhal/command") for r in records} == {"discover"}
    assert all(r.dagster_run.is_success for r in records)


def test_enrolling_alone_commits_nothing_when_a_host_fails(checkout: Path, fleet: SimFleet) -> None:
    """The trust-store-only path (`ssh_known_hosts` selected alone) records no key unless every host enrolled."""
    from narwhal_assets.core.errors import NarwhalError
    from narwhal_assets.runtime.runner import run_job

    with stopped(fleet, "h3"), pytest.raises(NarwhalError, match="node-3"):
        run_job(checkout, "discovery_job", "test", assets=["host_inventory", "ssh_known_hosts"])
    assert not (checkout / "config" / "ssh.known_hosts").exists()
    run_job(checkout, "discovery_job", "test", assets=["host_inventory", "ssh_known_hosts"])
    assert len(known_hosts_fingerprints(checkout / "config" / "ssh.known_hosts")) == 3


@pytest.mark.parametrize(("signum", "rc"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_discovery_within_seconds_with_one_line_and_nothing_published(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str], signum: int, rc: int
) -> None:
    """A host whose nvidia-smi hangs keeps the run busy; SIGTERM/SIGINT still end it at once: exit 143/130,
    one line on stderr (no traceback), the previous config set untouched."""
    discover(checkout, capsys)
    before = snapshot(checkout / "config")
    hang = b"#!/bin/sh\nexec sleep 120\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    runs_before = set(run_dirs(checkout))
    with replaced_file(fleet.host("h2").hostdir / "bin" / "nvidia-smi", hang):
        proc = subprocess.Popen([sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "discover"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while not (set(run_dirs(checkout)) - runs_before) and time.monotonic() < deadline:
            time.sleep(0.1)  # the run directory exists: the probes are under way
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        waited = time.monotonic() - sent
    assert proc.returncode == rc, err
    assert err.splitlines() == [f"deploy-hosts discover: interrupted by {signal.Signals(signum).name}; nothing was "
                                "published"], err  # fmt: skip
    assert waited < 10, waited
    assert snapshot(checkout / "config") == before


def test_a_full_disk_under_dagster_storage_says_whether_the_set_was_published(
    checkout: Path, fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dagster's storage on a filesystem that fills up: one line, no traceback, exit 1, and the line says
    truthfully whether the new config set was published (the config files agree with it)."""
    home = tmp_path / "tiny-dagster-home"
    home.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(home)], check=True)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")} | {"DAGSTER_HOME": str(home)}
        command = [sys.executable, "-m", "narwhal_assets", "--root", str(checkout), "discover"]
        first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert first.returncode == 0, first.stderr
        before = snapshot(checkout / "config")
        filler = home / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
        with replaced_file(fleet.model_path("h1", MODEL) / "tokenizer" / "special tokens.txt", b"<S>\n</S>\n"), \
                replaced_file(fleet.model_path("h2", MODEL) / "tokenizer" / "special tokens.txt", b"<S>\n</S>\n"), \
                replaced_file(fleet.model_path("h3", MODEL) / "tokenizer" / "special tokens.txt", b"<S>\n</S>\n"):
            full = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        lines = full.stderr.splitlines()
        assert full.returncode == 1, full.stderr
        assert len(lines) == 1 and "Traceback" not in full.stderr, full.stderr
        after = snapshot(checkout / "config")
        if "nothing was published" in lines[0]:
            assert after == before, [name for name in after if after[name] != before.get(name)]
        else:  # the set went out, then recording it failed: the line must say both
            assert "was published" in lines[0] and "lineage" in lines[0], lines[0]
            assert after != before
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)

"""Parsing probe documents: realistic fixtures parse; each malformed tool output is one exact, named line."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal_assets.core.discovery.digests import model_tree_digest, tree_digest
from narwhal_assets.core.discovery.observations import CheckpointDigest, CheckpointFile
from narwhal_assets.core.errors import InputError, NarwhalError, ProbeOutputError
from narwhal_assets.protocols.probe_report import (
    MAX_PROBLEMS,
    command_log,
    duplicates,
    parse_ip_json,
    parse_nvidia_smi,
    parse_os_release,
    parse_probe_output,
    render_command_log,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NVIDIA = (FIXTURES / "nvidia-smi-query-h200x8.csv").read_text()
IP_JSON = (FIXTURES / "ip-json-address.json").read_text()
DOCKER = (FIXTURES / "docker-image-inspect.json").read_text()
IMAGE = "registry.example.com/narwhal/engine:2026.11.1"
IMAGE_ID = "sha256:5b3c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c"
NVIDIA_ARGV = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,pci.bus_id", "--format=csv,noheader,nounits"]
HOST = "host node-2: "


def tool(argv: list[str], stdout: str, rc: int = 0, stderr: str = "") -> dict[str, Any]:
    return {"argv": argv, "rc": rc, "stdout": stdout, "stderr": stderr, "seconds": 0.012}


def host_file(path: str, text: str | None, error: str | None = None) -> dict[str, Any]:
    return {"path": path, "text": text, "error": error}


def checkpoint_files() -> list[dict[str, Any]]:
    contents = {"config.json": b'{"torch_dtype": "bfloat16"}', "model.safetensors": b"weights", "tok/t.json": b"{}"}
    return [
        {
            "path": p,
            "size": len(d),
            "mtime_ns": 1_700_000_000_000_000_000 + i,
            "inode": 100 + i,
            "sha256": hashlib.sha256(d).hexdigest(),
        }
        for i, (p, d) in enumerate(contents.items())
    ]


def good_doc() -> dict[str, Any]:
    """What the probe prints on a healthy 8x H200 engine host (see test_probe for the real thing)."""
    files = checkpoint_files()
    tools = {
        "hostname": tool(["hostname"], "gpu-node-2\n"),
        "uname": tool(["uname", "-r"], "6.8.0-49-generic\n"),
        "nvidia-smi": tool(NVIDIA_ARGV, NVIDIA),
        "ip": tool(["ip", "-json", "address"], IP_JSON),
        "docker": tool(["docker", "image", "inspect", IMAGE], DOCKER),
        "docker-packages": tool(["docker", "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint",
                                 "python3", IMAGE_ID, "-c", "..."], '{"nixl": "0.6.1", "vllm": "0.11.0"}\n'),
    }
    return {
        "schema": "narwhal.probe",
        "schema_version": 1,
        "python": "3.12.3",
        "seconds": 1.5,
        "tools": tools,
        "log": copy.deepcopy(list(tools.values())),
        "errors": [],
        "files": {
            "machine_id": host_file("/etc/machine-id", "3d1219c7c4c5404aaa1f6d2a48adfda4\n"),
            "boot_id": host_file("/proc/sys/kernel/random/boot_id", "445e7957-0a03-4c38-9780-81107a6c3a9f\n"),
            "os_release": host_file("/etc/os-release", 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\n'),
        },
        "link_speeds": {"lo": None, "eno1": 25000, "eno2": None, "ibp26s0": 400000, "ibp156s0": 400000},
        "rdma": [
            {
                "device": "mlx5_0",
                "port": "1",
                "state": "4: ACTIVE",
                "link_layer": "InfiniBand",
                "rate": "400 Gb/sec (4X NDR)",
                "netdevs": ["ibp26s0"],
                "verbs": ["uverbs0"],
            },
        ],
        "rdma_devices": ["rdma_cm", "uverbs0"],
        "image": IMAGE,
        "packages_reused": None,
        "models": {
            "engine-1": {
                "model_dir": "/srv/models/m",
                "ok": True,
                "config_sha256": files[0]["sha256"],
                "config_text": '{"model_type": "llama", "max_position_embeddings": 131072}',
                "files": files,
                "bytes_hashed": 10,
                "bytes_reused": 29,
                "files_reused": 2,
                "seconds": 0.1,
            },
        },
    }


def parse(doc: dict[str, Any], roles: list[str] | None = None) -> Any:
    return parse_probe_output("node-2", roles or ["engine-1"], "SHA256:abc", json.dumps(doc), "2026-11-30T00:00:00Z")


def problems_of(doc: dict[str, Any], roles: list[str] | None = None) -> list[str]:
    with pytest.raises(ProbeOutputError) as caught:
        parse(doc, roles)
    return caught.value.problems


def test_a_healthy_engine_host_parses_completely() -> None:
    observation, digests, log = parse(good_doc(), ["router", "engine-1"])
    assert (observation.hostname, observation.kernel, observation.python) == (
        "gpu-node-2",
        "6.8.0-49-generic",
        "3.12.3",
    )
    assert observation.os_release == "Ubuntu 24.04.1 LTS"
    assert observation.machine_id == "3d1219c7c4c5404aaa1f6d2a48adfda4"
    assert len(observation.gpus) == 8
    gpu = observation.gpus[7]
    assert (gpu.index, gpu.name, gpu.memory_total_mib, gpu.pci_bus_id) == (7, "NVIDIA H200", 143771, "00000000:DB:00.0")
    eno1 = observation.interface("eno1")
    assert eno1 is not None and (eno1.state, eno1.speed_mbps, eno1.mac) == ("UP", 25000, "7c:c2:55:9a:10:2e")
    assert [(a.family, a.address, a.prefixlen, a.scope) for a in eno1.addresses] == [
        ("inet", "198.18.0.12", 24, "global"),
        ("inet6", "2001:db8:18::12", 64, "global"),
        ("inet6", "fe80::7ec2:55ff:fe9a:102e", 64, "link"),
    ]
    assert observation.interface("eno2").addresses == []  # type: ignore[union-attr]
    assert observation.rdma[0].active and observation.rdma[0].port == 1
    assert observation.image is not None and observation.image.id == IMAGE_ID
    assert observation.image.repo_digests[0].startswith("registry.example.com/narwhal/engine@sha256:")
    digest = digests["engine-1"]
    assert digest.tree_sha256 == tree_digest(digest.files)
    assert (digest.bytes_hashed, digest.bytes_reused, digest.files_reused) == (10, 29, 2)
    assert observation.models["engine-1"].file_count == 3
    assert observation.host_key_fingerprint == "SHA256:abc"
    assert len(log) == 6
    assert observation.image.packages == {"nixl": "0.6.1", "vllm": "0.11.0"}
    assert (observation.rdma[0].verbs, observation.rdma_devices) == (["uverbs0"], ["rdma_cm", "uverbs0"])
    assert digest.model_tree_sha256 == model_tree_digest(digest.files)


def test_image_package_versions_from_the_image_or_reused_for_the_same_id() -> None:
    doc = good_doc()
    doc["tools"]["docker-packages"]["stdout"] = "not json"
    assert problems_of(doc) == [HOST + "docker run (package versions in the image): output is not JSON (Expecting "
                                       "value at line 1 column 1)"]  # fmt: skip
    doc["tools"]["docker-packages"] = tool(["docker", "run"], "", rc=125, stderr="docker: No such image\n")
    assert problems_of(doc) == [HOST + "docker run (package versions in the image): exit 125: docker: No such image"]
    doc["tools"]["docker-packages"] = tool(["docker", "run"], '{"vllm": "0.11 with spaces"}')
    assert problems_of(doc) == [HOST + "docker run (package versions in the image): expected an object of package "
                                       "names and versions"]  # fmt: skip
    del doc["tools"]["docker-packages"]
    doc["packages_reused"] = {"vllm": "0.10.2", "nixl": "0.5.0"}  # the workstation's own, for this image id
    observation, _, _ = parse(doc)
    assert observation.image is not None and observation.image.packages == {"nixl": "0.5.0", "vllm": "0.10.2"}


def test_rdma_device_names_are_checked() -> None:
    doc = good_doc()
    doc["rdma_devices"] = ["uverbs0", ".."]
    assert problems_of(doc) == [HOST + "rdma: /dev/infiniband entry '..' is not a device name"]


def test_the_real_h200_capture_parses() -> None:
    capture = FIXTURES / "h200-capture" / "nvidia-smi-query.csv"
    gpus, problems = parse_nvidia_smi(capture.read_text())
    assert problems == [] and [(g.name, g.memory_total_mib) for g in gpus] == [("NVIDIA H200", 143771)]


def test_nvidia_smi_absent_is_an_error_on_an_engine_host() -> None:
    doc = good_doc()
    doc["tools"]["nvidia-smi"] = tool(NVIDIA_ARGV, "", rc=127, stderr="nvidia-smi: command not found\n")
    assert problems_of(doc) == [HOST + "nvidia-smi: command not found (exit 127); engine roles need GPUs"]


def test_a_router_only_host_needs_no_gpus_image_or_model() -> None:
    doc = good_doc()
    doc["tools"]["nvidia-smi"] = tool(NVIDIA_ARGV, "", rc=127, stderr="nvidia-smi: command not found\n")
    del doc["tools"]["docker"]
    doc.update(image=None, models={})
    observation, digests, _ = parse(doc, ["router"])
    assert (observation.gpus, observation.image, observation.models, digests) == ([], None, {}, {})


def test_wrong_column_count_names_the_line() -> None:
    doc = good_doc()
    lines = NVIDIA.splitlines()
    lines[1] = "1, GPU-9e2248aa-2491-481b-87c5-dc09b5892655, NVIDIA H200"
    doc["tools"]["nvidia-smi"]["stdout"] = "\n".join(lines) + "\n"
    assert problems_of(doc) == [HOST + "nvidia-smi: line 2: expected 5 comma-separated fields, got 3"]


def test_non_integer_memory_names_the_line_and_field() -> None:
    doc = good_doc()
    doc["tools"]["nvidia-smi"]["stdout"] = NVIDIA.replace("143771", "[N/A]", 1)
    assert problems_of(doc) == [HOST + "nvidia-smi: line 1: memory.total '[N/A]' is not an integer"]


def test_nvidia_smi_failure_quotes_its_message() -> None:
    doc = good_doc()
    stdout = (FIXTURES / "h200-capture" / "nvidia-smi-bad.txt").read_text()
    doc["tools"]["nvidia-smi"] = tool(NVIDIA_ARGV, stdout, rc=2)
    assert problems_of(doc) == [
        HOST + 'nvidia-smi: exit 2: Field "bogus.field" is not a valid field to query.; engine roles need GPUs'
    ]


def test_nvidia_smi_with_no_gpus_or_duplicate_indices() -> None:
    doc = good_doc()
    doc["tools"]["nvidia-smi"]["stdout"] = ""
    assert problems_of(doc) == [HOST + "nvidia-smi: lists no GPUs; engine roles need GPUs"]
    gpus, problems = parse_nvidia_smi(NVIDIA.splitlines()[0] + "\n" + NVIDIA.splitlines()[0] + "\n")
    assert len(gpus) == 2
    assert problems == [
        "nvidia-smi: duplicate GPU index 0",
        "nvidia-smi: duplicate GPU uuid GPU-bc087a02-3415-49ca-a6cd-1c580bad0d02",
    ]


def test_ip_output_that_is_not_json() -> None:
    doc = good_doc()
    doc["tools"]["ip"]["stdout"] = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n"
    assert problems_of(doc) == [HOST + "ip -json address: output is not JSON (Extra data at line 1 column 2)"]


def test_ip_absent_or_odd_entries() -> None:
    doc = good_doc()
    doc["tools"]["ip"] = tool(["ip", "-json", "address"], "", rc=127, stderr="ip: command not found\n")
    assert problems_of(doc) == [HOST + "ip -json address: command not found (exit 127)"]
    interfaces, problems = parse_ip_json('[{"ifname": "x", "addr_info": [{}, {"family": "inet"}]}, {"mtu": 1}]', {})
    assert [i.name for i in interfaces] == ["x"]
    assert problems == [
        "ip -json address: x: address entry without 'local' and integer 'prefixlen'",
        "ip -json address: interface 2: missing 'ifname'",
    ]
    assert parse_ip_json('{"ifname": "x"}', {})[1] == [
        "ip -json address: expected a JSON array of interfaces, got dict"
    ]


def test_docker_no_such_image() -> None:
    doc = good_doc()
    doc["tools"]["docker"] = tool(
        ["docker", "image", "inspect", IMAGE],
        "[]\n",
        rc=1,
        stderr=f"Error response from daemon: No such image: {IMAGE}\n",
    )
    assert problems_of(doc) == [
        HOST + f"docker image inspect: exit 1: Error response from daemon: No such image: {IMAGE}"
    ]


def test_docker_image_id_must_be_sha256() -> None:
    doc = good_doc()
    doc["tools"]["docker"]["stdout"] = DOCKER.replace(IMAGE_ID, "sha256:abc")
    assert problems_of(doc) == [HOST + f"docker image inspect: {IMAGE}: Id 'sha256:abc' is not sha256:<64 hex>"]
    doc["tools"]["docker"]["stdout"] = "[]"
    assert problems_of(doc) == [HOST + f"docker image inspect: expected a JSON array with one image for {IMAGE}, got 0"]


def test_every_problem_of_a_host_is_reported_at_once() -> None:
    doc = good_doc()
    doc["tools"]["nvidia-smi"]["stdout"] = "0, GPU-x, NVIDIA H200\n"
    doc["tools"]["ip"]["stdout"] = "not json"
    doc["tools"]["docker"]["stdout"] = "{"
    doc["files"]["machine_id"] = host_file("/etc/machine-id", None, "No such file or directory")
    doc["errors"] = [{"tool": "checkpoint", "message": "engine-1: /srv/models/m/x: dangling symlink"}]
    doc["models"]["engine-1"]["ok"] = False
    assert problems_of(doc) == [
        HOST + "checkpoint: engine-1: /srv/models/m/x: dangling symlink",
        HOST + "/etc/machine-id: No such file or directory",
        HOST + "nvidia-smi: line 1: expected 5 comma-separated fields, got 3",
        HOST + "ip -json address: output is not JSON (Expecting value at line 1 column 1)",
        HOST + "docker image inspect: output is not JSON (Expecting property name enclosed in double quotes at line 1 "
        "column 2)",
    ]


def test_malformed_host_identity_and_facts() -> None:
    doc = good_doc()
    doc["files"]["machine_id"]["text"] = "not-an-id\n"
    doc["files"]["boot_id"]["text"] = "nope"
    doc["tools"]["hostname"]["stdout"] = "\n"
    del doc["python"]
    assert problems_of(doc) == [
        HOST + "hostname: printed nothing",
        HOST + "/etc/machine-id: expected 32 hex digits",
        HOST + "/proc/sys/kernel/random/boot_id: expected a UUID",
        HOST + "python3: version not reported",
    ]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("", "probe: printed nothing (is python3 installed on the host?)"),
        ("Traceback (most recent call last):", "probe: output is not JSON (Expecting value at line 1 column 1)"),
        ("[]", "probe: output is not a JSON object"),
        ('{"schema": "other", "schema_version": 1}', "probe: unexpected schema 'other' version 1"),
    ],
)
def test_unusable_probe_output(raw: str, problem: str) -> None:
    with pytest.raises(ProbeOutputError) as caught:
        parse_probe_output("node-2", ["engine-1"], "SHA256:abc", raw, "now")
    assert caught.value.problems == [HOST + problem]
    assert command_log(raw) == []


def test_bad_checkpoint_entries_are_named() -> None:
    doc = good_doc()
    model = doc["models"]["engine-1"]
    model["files"][1]["sha256"] = "XYZ"
    model["files"][2]["size"] = "big"
    model["bytes_hashed"] = -1
    assert problems_of(doc) == [
        HOST + "checkpoint engine-1: model.safetensors: sha256 is not 64 hex digits",
        HOST + "checkpoint engine-1: file 3: invalid size",
        HOST + "checkpoint engine-1: bytes_hashed is not a non-negative integer",
    ]


def test_a_failed_model_without_a_probe_error_is_still_reported() -> None:
    doc = good_doc()
    doc["models"]["engine-1"]["ok"] = False
    assert problems_of(doc) == [HOST + "checkpoint engine-1: the probe could not hash this model directory"]


def test_unreadable_rdma_port() -> None:
    doc = good_doc()
    doc["rdma"][0]["state"] = None
    assert problems_of(doc) == [HOST + "rdma: mlx5_0 port 1: state or link_layer unreadable"]


@pytest.mark.parametrize(
    ("text", "pretty"),
    [
        ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n', "Debian GNU/Linux 12 (bookworm)"),
        ("PRETTY_NAME='Rocky Linux 9.4 (Blue Onyx)'\n", "Rocky Linux 9.4 (Blue Onyx)"),
        ("NAME=Alpine\nPRETTY_NAME=Alpine\n", "Alpine"),
        ('PRETTY_NAME="unterminated\n', "unterminated"),
        ("NAME=x\n", "Linux"),
    ],
)
def test_os_release_pretty_name(text: str, pretty: str) -> None:
    assert parse_os_release(text) == pretty


def test_errors_keep_the_command_log_for_logs_dir() -> None:
    doc = good_doc()
    doc["tools"]["ip"]["stdout"] = "x"
    with pytest.raises(ProbeOutputError) as caught:
        parse(doc)
    assert caught.value.command_log == doc["log"]
    assert command_log(json.dumps(doc)) == doc["log"]


def test_render_command_log() -> None:
    entries = [
        tool(["nvidia-smi", "--query-gpu=index"], "0\n"),
        tool(["docker", "image", "inspect", "img:1"], "[]", rc=1, stderr="Error: No such image: img:1\n"),
    ]
    assert render_command_log(entries) == (
        "$ nvidia-smi --query-gpu=index\n"
        "0\n"
        "exit 0 after 0.012 s\n"
        "\n"
        "$ docker image inspect img:1\n"
        "[]\n"
        "[stderr]\n"
        "Error: No such image: img:1\n"
        "exit 1 after 0.012 s\n"
    )
    assert render_command_log([{"argv": ["echo", "a b"], "rc": 0}]) == "$ echo 'a b'\nexit 0\n"


def test_model_config_content_is_parsed_and_bad_json_is_named() -> None:
    observation = parse(good_doc())[0]
    assert observation.models["engine-1"].config["max_position_embeddings"] == 131072
    doc = good_doc()
    doc["models"]["engine-1"]["config_text"] = "{not json"
    expected = "host node-2: checkpoint engine-1: config.json: not JSON (Expecting property name enclosed in double"
    assert any(p.startswith(expected) and p.endswith("at line 1 column 2)") for p in problems_of(doc))


# ---------------------------------------------------------------------------------------------- hostile output


def test_probe_output_problems_are_host_failures_not_bad_input() -> None:
    """A host's malformed output exits 1 like any host failure; exit 2 is for the operator's input."""
    assert not issubclass(ProbeOutputError, InputError)
    assert issubclass(ProbeOutputError, NarwhalError)


class Counted:
    """A value that counts how often it is compared: a pairwise duplicate search compares n^2 times."""

    comparisons = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        Counted.comparisons += 1
        return isinstance(other, Counted) and other.value == self.value

    def __str__(self) -> str:
        return str(self.value)


def test_duplicate_detection_compares_each_value_a_bounded_number_of_times() -> None:
    values = [Counted(i) for i in range(5000)] + [Counted(7), Counted(7), Counted(11)]
    Counted.comparisons = 0
    assert duplicates(values) == ["11", "7"]
    assert Counted.comparisons <= 2 * len(values), f"{Counted.comparisons} comparisons for {len(values)} values"


def test_a_flood_of_valid_duplicate_gpu_rows_is_reported_in_bounded_lines() -> None:
    """8 MiB of identical valid rows (what the transport lets through at most): one linear pass, and the
    problem lines stay short (the old pairwise search needed ~10^10 comparisons here)."""
    row = NVIDIA.splitlines()[0] + "\n"
    doc = good_doc()
    doc["tools"]["nvidia-smi"]["stdout"] = row * ((8 << 20) // len(row))
    problems = problems_of(doc)
    assert problems[0].startswith(HOST + "nvidia-smi: duplicate GPU index 0") and len(problems) == 2
    assert all(len(p) < 600 for p in problems)


def test_a_host_reports_at_most_max_problems_lines_each_escaped_and_bounded() -> None:
    flood = good_doc()
    flood["tools"]["nvidia-smi"]["stdout"] = "x\n" * 5000
    problems = problems_of(flood)
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1] == f"{HOST}... and {5000 - MAX_PROBLEMS} more problems (see the command log)"
    hostile = good_doc()
    hostile["tools"]["docker"] = tool(["docker"], "", rc=1, stderr="\x1b]0;pwned\x07" + "E" * 10_000 + "\nforged\n")
    [problem] = problems_of(hostile)
    assert problem.startswith(HOST + "docker image inspect: exit 1: \\x1b]0;pwned\\x07EEE") and "forged" not in problem
    assert "\x1b" not in "".join([*problems, problem]) and all(len(p) < 600 for p in [*problems, problem])


@pytest.mark.parametrize("where", ["probe", "ip", "docker", "config"])
def test_json_nested_too_deeply_is_a_problem_not_a_crash(where: str) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    doc = good_doc()
    if where == "probe":
        with pytest.raises(ProbeOutputError) as caught:
            parse_probe_output("node-2", ["engine-1"], "SHA256:abc", deep, "now")
        assert caught.value.problems == [HOST + "probe: output is not JSON this program reads (nested too deeply)"]
        return
    if where == "config":
        doc["models"]["engine-1"]["config_text"] = deep
    else:
        doc["tools"][where]["stdout"] = deep
    assert any("nested too deeply" in p for p in problems_of(doc))


def test_command_log_escapes_control_characters_but_keeps_lines() -> None:
    entries = [tool(["hostname"], "evil\x1b]0;pwned\x07\r\nsecond line\n", rc="\x1b[2J")]  # type: ignore[arg-type]
    rendered = render_command_log(entries)
    assert rendered == "$ hostname\nevil\\x1b]0;pwned\\x07\\r\nsecond line\nexit \\x1b[2J after 0.012 s\n"


def _previous_digest() -> CheckpointDigest:
    files = [CheckpointFile.model_validate(f) for f in good_doc()["models"]["engine-1"]["files"]]
    return CheckpointDigest(
        engine="engine-1", host_id="node-2", model_dir="/srv/models/m", files=files,
        tree_sha256=tree_digest(files), bytes_hashed=39, bytes_reused=0, files_reused=0,
    )  # fmt: skip


def test_an_unchanged_tree_keeps_the_previous_table_that_was_sent() -> None:
    doc = good_doc()
    doc["models"]["engine-1"].update(unchanged=True, files=[])
    previous = _previous_digest()
    raw = json.dumps(doc)
    digest = parse_probe_output("node-2", ["engine-1"], "SHA256:abc", raw, "now", {"engine-1": previous})[1]["engine-1"]
    assert digest.files == previous.files and digest.tree_sha256 == previous.tree_sha256


@pytest.mark.parametrize(
    ("change", "sent", "problem"),
    [
        ({}, False, "reported unchanged, but no previous table was sent"),
        ({"files": [{"path": "config.json"}]}, True, "reported unchanged, yet lists files"),
        ({"config_sha256": "0" * 64}, True, "reported unchanged, but its config.json sha256 is not the previous one"),
    ],
)
def test_a_host_claiming_an_unchanged_tree_is_held_to_what_it_was_sent(
    change: dict[str, Any], sent: bool, problem: str
) -> None:
    doc = good_doc()
    doc["models"]["engine-1"].update({"unchanged": True, "files": [], **change})
    previous = {"engine-1": _previous_digest()} if sent else {}
    with pytest.raises(ProbeOutputError) as caught:
        parse_probe_output("node-2", ["engine-1"], "SHA256:abc", json.dumps(doc), "now", previous)
    assert caught.value.problems == [f"host node-2: checkpoint engine-1: {problem}"]

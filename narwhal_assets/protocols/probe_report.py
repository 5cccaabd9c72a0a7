"""Turn the probe's JSON document into observations; pure, so every malformed tool output is unit-tested.

The probe (`narwhal_assets.host.probe`) returns raw tool output on purpose: the formats of
`nvidia-smi`, `ip -json` and `docker image inspect` are judged here, where a surprise becomes one clear
line naming the host and the tool (`host node-2: nvidia-smi: line 2: expected 5 comma-separated fields,
got 3`), with every problem of the host collected before raising `ProbeOutputError`: a host failure
(exit 1), not the operator's bad input.

Everything here is hostile input: each pass is linear in the document (the transport already capped it
at `DEFAULT_OUTPUT_LIMIT` bytes), a host reports at most `MAX_PROBLEMS` lines, and every line is escaped
for a terminal (`core.display.printable`) because it quotes what the host printed.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from narwhal_assets.core.discovery.digests import model_tree_digest, tree_digest
from narwhal_assets.core.discovery.observations import (
    CheckpointDigest,
    CheckpointFile,
    Gpu,
    HostObservation,
    ImageObservation,
    ModelObservation,
    NetAddress,
    NetInterface,
    RdmaPort,
)
from narwhal_assets.core.display import printable, printable_block
from narwhal_assets.core.errors import ProbeOutputError
from narwhal_assets.core.records import IMAGE_ID_RE, SHA256_RE
from narwhal_assets.core.roles import engine_number

PROBE_SCHEMA = "narwhal.probe"
PROBE_SCHEMA_VERSION = 1
NVIDIA_SMI = "nvidia-smi"
IP = "ip -json address"
DOCKER = "docker image inspect"
DOCKER_PACKAGES = "docker run (package versions in the image)"
DEVICE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")  # a file name, never "." or ".."
PACKAGE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
GPU_FIELDS = ("index", "uuid", "name", "memory.total", "pci.bus_id")
MACHINE_ID_RE = re.compile(r"[0-9a-f]{32}")
BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
EXCERPT = 200
MAX_PROBLEMS = 20
LINE_LIMIT = 400

__all__ = [
    "command_log",
    "duplicates",
    "parse_docker_inspect",
    "parse_ip_json",
    "parse_models",
    "parse_nvidia_smi",
    "parse_os_release",
    "parse_packages",
    "parse_probe_output",
    "parse_rdma",
    "parse_rdma_devices",
    "render_command_log",
]


def host_problems(host_id: str, problems: list[str]) -> list[str]:
    """`host <id>: <problem>` lines, escaped for a terminal, at most MAX_PROBLEMS of them plus a count."""
    lines = [f"host {host_id}: {printable(p, LINE_LIMIT)}" for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"host {host_id}: ... and {len(problems) - MAX_PROBLEMS} more problems (see the command log)")
    return lines


def duplicates(values: Iterable[Hashable]) -> list[str]:
    """The values occurring more than once, as sorted strings; one counting pass (hashing), never pairwise."""
    return sorted(str(value) for value, count in Counter(values).items() if count > 1)


def _json(text: str) -> tuple[Any, str | None]:
    """json.loads that turns every failure into a message: malformed text, or nesting too deep to decode."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return None, "not JSON this program reads (nested too deeply)"


# ---------------------------------------------------------------- small helpers


def _excerpt(text: str) -> str:
    """The first non-empty line of a tool's message, bounded, for an error line."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= EXCERPT else line[:EXCERPT] + "..."


def _tool_failure(label: str, result: Any) -> str | None:
    """Why a tool result cannot be used (not run, missing, non-zero exit), or None when it can."""
    if not isinstance(result, Mapping) or not isinstance(result.get("rc"), int):
        return f"{label}: no result in the probe output"
    rc = result["rc"]
    if rc == 127:
        return f"{label}: command not found (exit 127)"
    if rc != 0:
        message = _excerpt(str(result.get("stderr") or "")) or _excerpt(str(result.get("stdout") or ""))
        return f"{label}: exit {rc}: {message}" if message else f"{label}: exit {rc}"
    return None


def _stdout(result: Any) -> str:
    return str(result.get("stdout") or "") if isinstance(result, Mapping) else ""


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


# ---------------------------------------------------------------- nvidia-smi


def _gpu_row(number: int, line: str) -> tuple[Gpu | None, list[str]]:
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != len(GPU_FIELDS):
        return None, [
            f"{NVIDIA_SMI}: line {number}: expected {len(GPU_FIELDS)} comma-separated fields, got {len(fields)}"
        ]
    index, uuid, name, memory, bus_id = fields
    problems = [
        f"{NVIDIA_SMI}: line {number}: {label} {value!r} is not an integer"
        for label, value in (("index", index), ("memory.total", memory))
        if _as_int(value) is None
    ]
    problems += [
        f"{NVIDIA_SMI}: line {number}: {label} is empty"
        for label, value in (("uuid", uuid), ("name", name), ("pci.bus_id", bus_id))
        if not value
    ]
    if problems:
        return None, problems
    return Gpu(index=int(index), uuid=uuid, name=name, memory_total_mib=int(memory), pci_bus_id=bus_id), []


def parse_nvidia_smi(stdout: str) -> tuple[list[Gpu], list[str]]:
    """GPUs from `nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits`."""
    gpus: list[Gpu] = []
    problems: list[str] = []
    for number, line in enumerate(stdout.splitlines(), start=1):
        if not line.strip():
            continue
        gpu, row_problems = _gpu_row(number, line)
        problems += row_problems
        if gpu is not None:
            gpus.append(gpu)
    for label, values in (("index", [g.index for g in gpus]), ("uuid", [g.uuid for g in gpus])):
        repeated = duplicates(values)
        if repeated:
            more = f", ... ({len(repeated)} in all)" if len(repeated) > MAX_PROBLEMS else ""
            problems.append(f"{NVIDIA_SMI}: duplicate GPU {label} {', '.join(repeated[:MAX_PROBLEMS])}{more}")
    return sorted(gpus, key=lambda g: g.index), problems


def _gpus(result: Any, needs_gpus: bool) -> tuple[list[Gpu], list[str]]:
    """GPUs are required on engine hosts; on a router-only host a missing or failing nvidia-smi is fine."""
    failure = _tool_failure(NVIDIA_SMI, result)
    if failure:
        return [], [f"{failure}; engine roles need GPUs"] if needs_gpus else []
    gpus, problems = parse_nvidia_smi(_stdout(result))
    if needs_gpus and not gpus and not problems:
        problems.append(f"{NVIDIA_SMI}: lists no GPUs; engine roles need GPUs")
    return gpus, problems


# ---------------------------------------------------------------- ip -json address


def _address(label: str, info: Any) -> tuple[NetAddress | None, list[str]]:
    if not isinstance(info, Mapping) or not info or info.get("family") not in ("inet", "inet6"):
        return None, []  # `ip` prints `{}` for filtered entries; other families are not addresses we use
    local, prefixlen = info.get("local"), info.get("prefixlen")
    if not isinstance(local, str) or not isinstance(prefixlen, int) or isinstance(prefixlen, bool):
        return None, [f"{IP}: {label}: address entry without 'local' and integer 'prefixlen'"]
    scope = info["scope"] if isinstance(info.get("scope"), str) else "global"
    return NetAddress(family=info["family"], address=local, prefixlen=prefixlen, scope=scope), []


def _interface(number: int, entry: Any, speeds: Mapping[str, Any]) -> tuple[NetInterface | None, list[str]]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("ifname"), str) or not entry["ifname"]:
        return None, [f"{IP}: interface {number}: missing 'ifname'"]
    name = entry["ifname"]
    infos = entry.get("addr_info", [])
    if not isinstance(infos, list):
        return None, [f"{IP}: {name}: 'addr_info' is not a list"]
    addresses: list[NetAddress] = []
    problems: list[str] = []
    for info in infos:
        address, address_problems = _address(name, info)
        problems += address_problems
        if address is not None:
            addresses.append(address)
    speed = speeds.get(name)
    mac = entry.get("address") if isinstance(entry.get("address"), str) else None
    state = entry["operstate"] if isinstance(entry.get("operstate"), str) else "UNKNOWN"
    speed_mbps = speed if isinstance(speed, int) and not isinstance(speed, bool) and speed > 0 else None
    return NetInterface(name=name, state=state, mac=mac, addresses=addresses, speed_mbps=speed_mbps), problems


def parse_ip_json(stdout: str, speeds: Mapping[str, Any]) -> tuple[list[NetInterface], list[str]]:
    """Interfaces from `ip -json address`, with link speeds (Mbit/s) read from sysfs by the probe."""
    entries, failure = _json(stdout)
    if failure:
        return [], [f"{IP}: output is {failure}"]
    if not isinstance(entries, list):
        return [], [f"{IP}: expected a JSON array of interfaces, got {type(entries).__name__}"]
    interfaces: list[NetInterface] = []
    problems: list[str] = []
    for number, entry in enumerate(entries, start=1):
        interface, entry_problems = _interface(number, entry, speeds)
        problems += entry_problems
        if interface is not None:
            interfaces.append(interface)
    return interfaces, problems


def _interfaces(result: Any, speeds: Any) -> tuple[list[NetInterface], list[str]]:
    failure = _tool_failure(IP, result)
    if failure:
        return [], [failure]
    return parse_ip_json(_stdout(result), speeds if isinstance(speeds, Mapping) else {})


# ---------------------------------------------------------------- RDMA


def parse_rdma(entries: Any) -> tuple[list[RdmaPort], list[str]]:
    """Ports read from `/sys/class/infiniband`; a port without a readable state or link layer is a problem."""
    if not isinstance(entries, list):
        return [], ["rdma: expected a list of ports"]
    ports: list[RdmaPort] = []
    problems: list[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            problems.append("rdma: malformed port entry")
            continue
        where = f"rdma: {entry.get('device')} port {entry.get('port')}"
        port = _as_int(str(entry.get("port")))
        state, layer, rate = entry.get("state"), entry.get("link_layer"), entry.get("rate")
        netdevs = entry["netdevs"] if isinstance(entry.get("netdevs"), list) else []
        if not isinstance(entry.get("device"), str) or port is None:
            problems.append(f"{where}: device name or port number unreadable")
        elif not isinstance(state, str) or not isinstance(layer, str):
            problems.append(f"{where}: state or link_layer unreadable")
        else:
            rate_text = rate if isinstance(rate, str) and rate else None
            names = [n for n in netdevs if isinstance(n, str)]
            listed = entry["verbs"] if isinstance(entry.get("verbs"), list) else []
            verbs = [v for v in listed if isinstance(v, str) and DEVICE_NAME_RE.fullmatch(v)]
            ports.append(RdmaPort(device=entry["device"], port=port, state=state, link_layer=layer, rate=rate_text,
                                  netdevs=names, verbs=verbs))  # fmt: skip
    return ports, problems


def parse_rdma_devices(names: Any) -> tuple[list[str], list[str]]:
    """The character devices the probe found under /dev/infiniband, by name."""
    if not isinstance(names, list):
        return [], ["rdma: expected a list of /dev/infiniband device names"]
    bad = [name for name in names if not isinstance(name, str) or not DEVICE_NAME_RE.fullmatch(name)]
    if bad:
        return [], [f"rdma: /dev/infiniband entry {printable(str(bad[0]), 64)!r} is not a device name"]
    return sorted(set(names)), []


# ---------------------------------------------------------------- docker image inspect


def parse_docker_inspect(reference: str, stdout: str) -> tuple[ImageObservation | None, list[str]]:
    """The image's immutable id and repo digests from `docker image inspect <reference>`."""
    images, failure = _json(stdout)
    if failure:
        return None, [f"{DOCKER}: output is {failure}"]
    if not isinstance(images, list) or len(images) != 1 or not isinstance(images[0], Mapping):
        count = len(images) if isinstance(images, list) else "no"
        return None, [f"{DOCKER}: expected a JSON array with one image for {reference}, got {count}"]
    image = images[0]
    image_id = image.get("Id")
    if not isinstance(image_id, str) or not IMAGE_ID_RE.fullmatch(image_id):
        return None, [f"{DOCKER}: {reference}: Id {image_id!r} is not sha256:<64 hex>"]
    digests = image.get("RepoDigests") or []
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        return None, [f"{DOCKER}: {reference}: RepoDigests is not a list of strings"]
    return ImageObservation(reference=reference, id=image_id, repo_digests=digests), []


def parse_packages(reused: Any, result: Any) -> tuple[dict[str, str], list[str]]:
    """The image's pinned package versions: the workstation's own, reused for the same image id, else what
    `docker run ... python3 -c <PACKAGES_PROGRAM>` printed (one JSON object, package -> version)."""
    if reused is not None:
        found: Any = reused
    else:
        failure = _tool_failure(DOCKER_PACKAGES, result)
        if failure:
            return {}, [failure]
        found, problem = _json(_stdout(result))
        if problem:
            return {}, [f"{DOCKER_PACKAGES}: output is {problem}"]
    if not isinstance(found, Mapping) or not all(
        isinstance(name, str) and PACKAGE_NAME_RE.fullmatch(name) and isinstance(version, str)
        and VERSION_RE.fullmatch(version) for name, version in found.items()
    ):  # fmt: skip
        return {}, [f"{DOCKER_PACKAGES}: expected an object of package names and versions"]
    return dict(sorted(found.items())), []


def _image(reference: Any, result: Any, reused: Any, packages: Any) -> tuple[ImageObservation | None, list[str]]:
    if reference is None:
        return None, []
    failure = _tool_failure(DOCKER, result)
    if failure:
        return None, [failure]
    image, problems = parse_docker_inspect(str(reference), _stdout(result))
    if image is None:
        return None, problems
    versions, problems = parse_packages(reused, packages)
    return image.model_copy(update={"packages": versions}), problems


# ---------------------------------------------------------------- checkpoints


def _checkpoint_files(engine: str, entries: Any) -> tuple[list[CheckpointFile], list[str]]:
    if not isinstance(entries, list):
        return [], [f"checkpoint {engine}: 'files' is not a list"]
    files: list[CheckpointFile] = []
    problems: list[str] = []
    for number, entry in enumerate(entries, start=1):
        try:
            checked = CheckpointFile.model_validate(entry)
        except ValidationError as exc:
            fields = ", ".join(sorted({".".join(map(str, e["loc"])) or "entry" for e in exc.errors()}))
            problems.append(f"checkpoint {engine}: file {number}: invalid {fields}")
            continue
        if not SHA256_RE.fullmatch(checked.sha256):
            problems.append(f"checkpoint {engine}: {checked.path}: sha256 is not 64 hex digits")
            continue
        files.append(checked)
    return files, problems


def _counter(engine: str, result: Mapping[str, Any], key: str, problems: list[str]) -> int:
    value = result.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    problems.append(f"checkpoint {engine}: {key} is not a non-negative integer")
    return 0


def _reused_files(
    engine: str, result: Mapping[str, Any], previous: CheckpointDigest | None
) -> tuple[list[CheckpointFile], list[str]]:
    """The previous table, when the probe says the tree is exactly the one it was sent for this engine."""
    if previous is None:
        return [], [f"checkpoint {engine}: reported unchanged, but no previous table was sent"]
    if result.get("files") != []:
        return [], [f"checkpoint {engine}: reported unchanged, yet lists files"]
    config = next((f.sha256 for f in previous.files if f.path == "config.json"), None)
    if result.get("config_sha256") != config:
        return [], [f"checkpoint {engine}: reported unchanged, but its config.json sha256 is not the previous one"]
    return previous.files, []


def _model(
    host_id: str, engine: str, result: Mapping[str, Any], previous: CheckpointDigest | None
) -> tuple[CheckpointDigest | None, list[str]]:
    if result.get("unchanged") is True:
        files, problems = _reused_files(engine, result, previous)
    else:
        files, problems = _checkpoint_files(engine, result.get("files"))
    model_dir = result.get("model_dir")
    if not isinstance(model_dir, str) or not model_dir:
        problems.append(f"checkpoint {engine}: model_dir missing")
    config = result.get("config_sha256")
    if not isinstance(config, str) or not SHA256_RE.fullmatch(config):
        problems.append(f"checkpoint {engine}: config.json sha256 missing")
    counts: dict[str, Any] = {key: _counter(engine, result, key, problems)
                              for key in ("bytes_hashed", "bytes_reused", "files_reused")}
    reused = previous is not None and files is previous.files
    tree = previous.tree_sha256 if reused and previous is not None else ""
    try:
        tree = tree or tree_digest(files)
    except ValueError as exc:
        problems.append(f"checkpoint {engine}: {exc}")
    if problems:
        return None, problems
    fleet_tree = (previous.model_tree_sha256 if reused and previous is not None else None) or model_tree_digest(files)
    digest = CheckpointDigest(engine=engine, host_id=host_id, model_dir=str(model_dir), files=files,
                              tree_sha256=tree, model_tree_sha256=fleet_tree, **counts)  # fmt: skip
    return digest, []


def _model_config(engine: str, text: Any) -> tuple[dict[str, Any], list[str]]:
    """The parsed config.json; launch policy reads limits such as max_position_embeddings from it."""
    config, failure = _json(text) if isinstance(text, str) else (None, None)
    if failure:
        return {}, [f"checkpoint {engine}: config.json: {failure}"]
    if not isinstance(config, dict):
        return {}, [f"checkpoint {engine}: config.json: expected a JSON object"]
    return config, []


def parse_models(
    host_id: str, models: Any, probe_failed: bool, previous: Mapping[str, CheckpointDigest]
) -> tuple[dict[str, ModelObservation], dict[str, CheckpointDigest], list[str]]:
    """Model observations and checkpoint digests per engine; a tree the probe refused yields neither.
    `previous` is what the probe was sent: an engine it reports unchanged keeps that digest's table."""
    if not isinstance(models, Mapping):
        return {}, {}, ["checkpoint: 'models' is not an object"]
    observations: dict[str, ModelObservation] = {}
    digests: dict[str, CheckpointDigest] = {}
    problems: list[str] = []
    for engine in sorted(models):
        result = models[engine]
        if not isinstance(result, Mapping) or not result.get("ok"):
            if not probe_failed:
                problems.append(f"checkpoint {engine}: the probe could not hash this model directory")
            continue
        digest, model_problems = _model(host_id, engine, result, previous.get(engine))
        problems += model_problems
        if digest is not None:
            digests[engine] = digest
            config, config_problems = _model_config(engine, result.get("config_text"))
            problems += config_problems
            observations[engine] = ModelObservation(
                model_dir=digest.model_dir,
                config_sha256=str(result["config_sha256"]),
                tree_sha256=digest.tree_sha256,
                model_tree_sha256=digest.model_tree_sha256,
                file_count=len(digest.files),
                config=config,
            )
    return observations, digests, problems


# ---------------------------------------------------------------- host facts


def parse_os_release(text: str) -> str:
    """PRETTY_NAME from os-release(5), whose documented default is "Linux"."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME":
            try:
                words = shlex.split(value)
            except ValueError:
                words = [value.strip().strip("\"'")]
            if words and words[0]:
                return words[0]
    return "Linux"


def _file_text(files: Any, key: str, default_path: str) -> tuple[str | None, list[str]]:
    entry = files.get(key) if isinstance(files, Mapping) else None
    if not isinstance(entry, Mapping):
        return None, [f"{default_path}: not read by the probe"]
    text = entry.get("text")
    if not isinstance(text, str):
        return None, [f"{entry.get('path') or default_path}: {entry.get('error') or 'unreadable'}"]
    return text, []


def _identity(files: Any, key: str, path: str, pattern: re.Pattern[str], shape: str) -> tuple[str, list[str]]:
    text, problems = _file_text(files, key, path)
    value = (text or "").strip()
    if text is not None and not pattern.fullmatch(value):
        problems.append(f"{path}: expected {shape}")
    return value, problems


def _command_text(tools: Mapping[str, Any], tool: str, label: str) -> tuple[str, list[str]]:
    result = tools.get(tool)
    failure = _tool_failure(label, result)
    if failure:
        return "", [failure]
    value = _stdout(result).strip()
    return (value, []) if value else ("", [f"{label}: printed nothing"])


def _host_facts(doc: Mapping[str, Any], tools: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    files = doc.get("files")
    facts: dict[str, str] = {}
    problems: list[str] = []
    facts["hostname"], found = _command_text(tools, "hostname", "hostname")
    problems += found
    facts["kernel"], found = _command_text(tools, "uname", "uname -r")
    problems += found
    facts["machine_id"], found = _identity(files, "machine_id", "/etc/machine-id", MACHINE_ID_RE, "32 hex digits")
    problems += found
    facts["boot_id"], found = _identity(files, "boot_id", "/proc/sys/kernel/random/boot_id", BOOT_ID_RE, "a UUID")
    problems += found
    os_text, found = _file_text(files, "os_release", "/etc/os-release")
    facts["os_release"] = parse_os_release(os_text or "")
    problems += found
    python = doc.get("python")
    facts["python"] = python if isinstance(python, str) else ""
    if not facts["python"]:
        problems.append("python3: version not reported")
    return facts, problems


# ---------------------------------------------------------------- the whole document


def _load(raw_json: str) -> tuple[dict[str, Any] | None, str | None]:
    if not raw_json.strip():
        return None, "probe: printed nothing (is python3 installed on the host?)"
    doc, failure = _json(raw_json)
    if failure:
        return None, f"probe: output is {failure}"
    if not isinstance(doc, dict):
        return None, "probe: output is not a JSON object"
    if doc.get("schema") != PROBE_SCHEMA or doc.get("schema_version") != PROBE_SCHEMA_VERSION:
        return None, f"probe: unexpected schema {doc.get('schema')!r} version {doc.get('schema_version')!r}"
    return doc, None


def _log_entries(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    entries = doc.get("log")
    if not isinstance(entries, list):
        return []
    return [dict(e) for e in entries if isinstance(e, Mapping) and isinstance(e.get("argv"), list)]


def command_log(raw_json: str) -> list[dict[str, Any]]:
    """The probe's command log, or [] when the output is unusable; never raises, so logs are always kept."""
    doc, _ = _load(raw_json)
    return _log_entries(doc) if doc is not None else []


def _probe_errors(doc: Mapping[str, Any]) -> list[str]:
    errors = doc.get("errors")
    if not isinstance(errors, list):
        return ["probe: 'errors' is not a list"]
    return [
        f"{e.get('tool', 'probe')}: {e.get('message', 'unknown error')}" if isinstance(e, Mapping) else f"probe: {e}"
        for e in errors
    ]


def parse_probe_output(
    host_id: str,
    roles: list[str],
    host_key_fingerprint: str,
    raw_json: str,
    observed_at: str,
    previous: Mapping[str, CheckpointDigest] | None = None,
) -> tuple[HostObservation, dict[str, CheckpointDigest], list[dict[str, Any]]]:
    """One host's observation, its checkpoint digests per engine, and its command log; `previous` holds
    the digests whose tables the probe was sent.

    Raises ProbeOutputError (a host failure) listing the problems as `host <id>: <tool>: <what>`.
    """
    doc, failure = _load(raw_json)
    if doc is None:
        raise ProbeOutputError(host_problems(host_id, [str(failure)]), [])
    log = _log_entries(doc)
    tools = doc["tools"] if isinstance(doc.get("tools"), Mapping) else {}
    engine_host = any(engine_number(role) is not None for role in roles)
    problems = _probe_errors(doc)
    facts, found = _host_facts(doc, tools)
    problems += found
    gpus, found = _gpus(tools.get("nvidia-smi"), engine_host)
    problems += found
    interfaces, found = _interfaces(tools.get("ip"), doc.get("link_speeds"))
    problems += found
    rdma, found = parse_rdma(doc.get("rdma", []))
    problems += found
    rdma_devices, found = parse_rdma_devices(doc.get("rdma_devices", []))
    problems += found
    image, found = _image(doc.get("image"), tools.get("docker"), doc.get("packages_reused"),
                          tools.get("docker-packages"))  # fmt: skip
    problems += found
    models, digests, found = parse_models(host_id, doc.get("models", {}), bool(doc.get("errors")), previous or {})
    problems += found
    if problems:
        raise ProbeOutputError(host_problems(host_id, problems), log)
    observation = HostObservation(
        host_id=host_id,
        roles=list(roles),
        observed_at=observed_at,
        host_key_fingerprint=host_key_fingerprint,
        gpus=gpus,
        interfaces=interfaces,
        rdma=rdma,
        rdma_devices=rdma_devices,
        image=image,
        models=models,
        **facts,
    )
    return observation, digests, log


# ---------------------------------------------------------------- logs/<host-id>.log


def _render_entry(entry: Mapping[str, Any]) -> str:
    argv = [str(arg) for arg in entry.get("argv", [])]
    parts = [f"$ {printable(shlex.join(argv), None)}\n"]
    for stream in ("stdout", "stderr"):
        text = printable_block(str(entry.get(stream) or ""))
        if text:
            if stream == "stderr":
                parts.append("[stderr]\n")
            parts.append(text if text.endswith("\n") else text + "\n")
    seconds = entry.get("seconds")
    timing = f" after {seconds:.3f} s" if isinstance(seconds, int | float) else ""
    parts.append(f"exit {printable(entry.get('rc', '?'), 20)}{timing}\n")
    return "".join(parts)


def render_command_log(entries: Iterable[Mapping[str, Any]]) -> str:
    """Human-readable log of the commands the probe ran: `$ argv`, stdout, `[stderr]` and stderr, `exit N`.

    Control characters other than newline and tab are escaped, so `cat`ing a log is as safe as the CLI."""
    return "\n".join(_render_entry(entry) for entry in entries)

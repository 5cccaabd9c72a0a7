"""Discovery: inspect every physical host over one SSH connection and derive the generated config set.

Flow: enrol host keys (accept-new, staged in the run directory), run the single probe program per host,
keep observations, checkpoint digests and command logs in `runs/discovery/<run>/`; then, once, build
deployment.env, launch records, fleet and profiling limits from operator settings plus that run's
observations and publish them together with the staged host keys. Any failure leaves `config/` as it was.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal_assets.core.discovery.digests import compare_replicas
from narwhal_assets.core.discovery.manifest import CONFIG_FORMAT, MANIFEST_FILE, DiscoveryManifest
from narwhal_assets.core.discovery.observations import CheckpointDigest, HostObservation
from narwhal_assets.core.discovery.retention import KEEP_RUNS_VARIABLE, keep_runs
from narwhal_assets.core.display import printable, printable_block
from narwhal_assets.core.errors import (
    HostFailure,
    InputError,
    NarwhalError,
    ProbeOutputError,
    Problems,
    raise_if,
    raise_together,
)
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Layer, Settings
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.deployment_env import build_deployment_env, render_deployment_env
from narwhal_assets.core.launch.engine_policy import operator_policy_problems
from narwhal_assets.core.launch.fleet import (
    Fleet,
    build_fleet,
    engine_count_problems,
    engine_credential,
    engine_roles,
)
from narwhal_assets.core.launch.launch_records import EngineLaunchConfig, LaunchSources, build_launch_records
from narwhal_assets.core.launch.policy import resolve_engine_field
from narwhal_assets.core.launch.profiling import ProfilingLimits, build_profiling_limits
from narwhal_assets.core.prepared_run.prepare_inputs import discovery_inputs_digest, input_digests
from narwhal_assets.core.roles import Role, engine_number
from narwhal_assets.host import program_stream
from narwhal_assets.local.checkpoint_store import load_checkpoint, prune_discovery_runs, save_checkpoint
from narwhal_assets.local.configset import publish_files, publish_lock
from narwhal_assets.local.privatefiles import ensure_private_dir, sha256_file, write_private
from narwhal_assets.protocols.probe import PROBE_PROGRAM, previous_hashes, probe_script
from narwhal_assets.protocols.probe_report import parse_probe_output, render_command_log
from narwhal_assets.ssh.access import host_access, host_accesses
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.transport import Connector, HostConnection
from narwhal_assets.ssh.trust import KnownHostsStore, StagedKey

PROBE_TIMEOUT_S = 1800.0  # a dead host is caught by the keep-alive; this bounds a first full hash
CHECKPOINT_FILE = "engine-{n}-checkpoint.json"
ARCHIVE_DIR = "previous-config"
STAGED_KEYS = "staged-known-hosts.json"
# 2: keys are named by inventory host and a digest of their known-hosts name (1 held addresses and aliases).
STAGED_KEYS_VERSION = 2


@dataclass
class DiscoveryRun:
    """One run directory and what it holds."""

    run_dir: Path
    observations: dict[str, HostObservation] = field(default_factory=dict)
    checkpoints: dict[str, CheckpointDigest] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> DiscoveryRun:
        """Read a finished run back (what downstream assets and the next discovery reuse)."""
        run = cls(run_dir)
        for path in sorted(run_dir.glob("*.json")):
            if path.name == MANIFEST_FILE:
                continue
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("schema") == "narwhal.host-observation":
                obs = HostObservation.model_validate(raw)
                run.observations[obs.host_id] = obs
            elif raw.get("schema") == "narwhal.checkpoint":
                digest = load_checkpoint(path)
                run.checkpoints[digest.engine] = digest
        return run


@dataclass(frozen=True)
class GeneratedConfig:
    """The discovered config set, validated together before any of it is written."""

    deployment_env: dict[str, str]
    launch: EngineLaunchConfig
    launch_sources: LaunchSources
    fleet: Fleet
    profiling: ProfilingLimits

    def files(self, settings: Settings) -> dict[Path, str]:
        return {
            settings.deployment_env_path: render_deployment_env(self.deployment_env),
            settings.launch_config_path: render_json(self.launch),
            settings.launch_sources_path: render_json(self.launch_sources),
            settings.fleet_path: render_json(self.fleet),
            settings.profiling_limits_path: render_json(self.profiling),
        }


def operator_settings(settings: Settings) -> Settings:
    """Settings without the discovered layer: discovery derives from `.env` and the hosts, not from itself."""
    return Settings(settings.root, tuple((layer, v) for layer, v in settings.layers if layer != Layer.DISCOVERED))


def with_discovered(settings: Settings, discovered: Mapping[str, str]) -> Settings:
    """Operator settings with freshly discovered values as the discovered layer."""
    layers = [(layer, discovered if layer == Layer.DISCOVERED else v) for layer, v in settings.layers]
    if all(layer != Layer.DISCOVERED for layer, _ in layers):
        layers.insert(1, (Layer.DISCOVERED, dict(discovered)))
    return Settings(settings.root, tuple(layers))


def new_run_dir(settings: Settings) -> Path:
    """`runs/discovery/<UTC time>-<random>`: sortable by time, unique across concurrent runs."""
    base = settings.discovery_dir
    name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
    run_dir = base / name
    ensure_private_dir(base)
    run_dir.mkdir(mode=0o700)
    ensure_private_dir(run_dir / "logs")
    return run_dir


def latest_complete_run(settings: Settings, exclude: Path | None = None) -> DiscoveryRun | None:
    """The newest earlier run that published a config set (it has a manifest).

    Run names sort by the second they started; within one second the random suffix says nothing, so the
    manifest's modification time decides.
    """
    base = settings.discovery_dir
    manifests = [p for p in base.glob("*/" + MANIFEST_FILE) if p.parent != exclude]
    if not manifests:
        return None
    newest = max(manifests, key=lambda p: (p.parent.name.split("-", 1)[0], p.stat().st_mtime_ns, p.parent.name))
    return DiscoveryRun.load(newest.parent)


def check_discovery_inputs(settings: Settings, inventory: Inventory) -> None:
    """Every problem of the operator's input that needs no host, all at once (InputError): what each probe is
    sent, every engine's launch policy, the serving roles and the engine credential. Discovery runs it before
    it saves the inventory or creates a run directory, so bad input leaves nothing behind."""
    problems = Problems()
    for entry in inventory.hosts:
        problems.attempt(probe_request, settings, entry, {}, True)
    for n in inventory.engine_numbers():
        problems += operator_policy_problems(settings, n)
    count = engine_count_problems(settings, inventory.engine_numbers())
    problems += count
    if not count:
        problems.attempt(engine_roles, settings, inventory.engine_numbers())
    problems.attempt(engine_credential, settings)
    raise_if(list(dict.fromkeys(problems)))


def probe_request(
    settings: Settings,
    entry: HostEntry,
    previous: Mapping[str, CheckpointDigest],
    full: bool,
    observed: HostObservation | None = None,
) -> str:
    """The probe program for one host: its engines' model directories, the engine image reference and, unless
    `full`, the previous per-file rows the probe may reuse, and the package versions of the image id the host
    was `observed` with last time (an image id names immutable content: the same id, the same packages)."""
    engines = [n for n in map(engine_number, entry.roles) if n is not None]
    models = {Role.engine(n).name: _required(settings, n, "MODEL_DIR") for n in engines}
    images = {_required(settings, n, "ENGINE_IMAGE") for n in engines}
    if len(images) > 1:
        raise InputError(
            [f"host {entry.id}: colocated engines must use one engine image (NARWHAL_NODE_<n>_ENGINE_IMAGE)"]
        )
    return probe_script(
        {
            "image": images.pop() if images else None,
            "models": models,
            "previous": {} if full else previous_hashes({e: d for e, d in previous.items() if e in models}),
            "full_hash": full,
            "known_packages": _known_packages(observed) if not full else {},
        }
    )


def _known_packages(observed: HostObservation | None) -> dict[str, dict[str, str]]:
    image = observed.image if observed is not None else None
    return {image.id: dict(image.packages)} if image is not None and image.packages else {}


def inspect_hosts(
    settings: Settings,
    inventory: Inventory,
    connector: Connector,
    run: DiscoveryRun,
    previous: Mapping[str, CheckpointDigest],
    full_hash: bool = False,
    observed: Mapping[str, HostObservation] | None = None,
) -> DiscoveryRun:
    """Probe every host in parallel; save what each returned; raise every host's problems together.
    `observed` holds the previous discovery's observations by host id (what a probe may reuse)."""
    requests = {entry.id: probe_request(settings, entry, previous, full_hash, (observed or {}).get(entry.id))
                for entry in inventory.hosts}  # fmt: skip
    observed_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def probe(connection: HostConnection) -> tuple[HostObservation, dict[str, CheckpointDigest]]:
        entry = inventory.host(connection.host_id)
        result = connection.run_program(PROBE_PROGRAM, program_stream(requests[entry.id]), timeout=PROBE_TIMEOUT_S)
        raw = result.text()
        try:
            parsed = parse_probe_output(entry.id, entry.roles, connection.fingerprint, raw, observed_at, previous)
        except ProbeOutputError as exc:
            # What a host printed is never the operator's input: it fails that host (exit 1), not the run's input.
            _write_log(run, entry.id, render_command_log(exc.command_log), result.stderr)
            if result.rc != 0:
                raise HostFailure(
                    f"host {entry.id}: probe exited {result.rc}: {printable(_first_line(result.stderr), 200)}"
                ) from None
            raise HostFailure(str(exc)) from None
        observation, digests, log = parsed
        # Saved here, while other hosts are still answering, not one after another once all have.
        _write_log(run, entry.id, render_command_log(log), result.stderr)
        write_private(run.run_dir / f"{entry.id}.json", render_json(observation))
        with checkpoint_lock:  # hosts with the same model share one table object
            for engine, digest in digests.items():
                save_checkpoint(run.run_dir / CHECKPOINT_FILE.format(n=engine_number(engine)), digest)
        return observation, digests

    checkpoint_lock = threading.Lock()
    outcomes = connector.map_hosts(host_accesses(settings, inventory.hosts), probe)
    failures: list[NarwhalError] = []
    for host_id, outcome in outcomes.items():
        if isinstance(outcome, NarwhalError):
            failures.append(outcome)
            continue
        observation, digests = outcome
        run.observations[host_id] = observation
        run.checkpoints.update(digests)
    raise_together(failures)
    compare_replicas(run.checkpoints)
    return run


def generate_config(settings: Settings, inventory: Inventory, run: DiscoveryRun) -> GeneratedConfig:
    """deployment.env, launch records and fleet from operator settings plus this run's observations."""
    discovered = build_deployment_env(settings, inventory, run.observations)
    effective = with_discovered(settings, discovered)
    model_configs = {
        n: model.config
        for obs in run.observations.values()
        for role, model in obs.models.items()
        if (n := engine_number(role)) is not None
    }
    records = build_launch_records(
        effective, inventory, run.observations, model_configs=model_configs, observation_dir=str(run.run_dir)
    )
    fleet = build_fleet(effective, inventory, run.observations, records.config)
    profiling = build_profiling_limits(fleet, records.config, str(settings.launch_config_path))
    return GeneratedConfig(discovered, records.config, records.sources, fleet, profiling)


def stage_enrolments(run: DiscoveryRun, entries: list[StagedKey]) -> None:
    """Keep this run's accept-new enrolments in the run directory until its config set is published.

    Like every artifact, the file names hosts by inventory id, never by destination: each key is recorded
    with the host whose connection presented it and the SHA-256 of its known-hosts name.
    """
    keys = [{"host_id": e.host_id, "hop": e.hop, "name_sha256": e.name_sha256, "key_type": e.key_type,
             "blob_b64": e.blob_b64} for e in entries]  # fmt: skip
    document = {"schema": "narwhal.staged-host-keys", "schema_version": STAGED_KEYS_VERSION, "keys": keys}
    write_private(run.run_dir / STAGED_KEYS, json.dumps(document, indent=2) + "\n")


def staged_enrolments(settings: Settings, inventory: Inventory, run: DiscoveryRun) -> list[StagedKey]:
    """This run's staged keys with their known-hosts names, resolved again from each host's destination.

    A name that no longer has the recorded digest (the destination or ssh config changed since the key was
    presented) is refused: the key was seen at another address.
    """
    path = run.run_dir / STAGED_KEYS
    if not path.exists():
        return []
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("schema_version") != STAGED_KEYS_VERSION:
        raise InputError([f"{path}: written by another version of discovery; run `deploy-hosts discover` again"])
    return [_resolve_staged(settings, inventory, raw) for raw in document["keys"]]


def _resolve_staged(settings: Settings, inventory: Inventory, raw: Mapping[str, Any]) -> StagedKey:
    host_id, hop = str(raw["host_id"]), bool(raw["hop"])
    endpoint = resolve_endpoint(host_access(settings, inventory.host(host_id)).destination, settings.ssh_config_path)
    for candidate in endpoint.hops() if hop else [endpoint]:
        entry = StagedKey(host_id, hop, *candidate.known_host, raw["key_type"], raw["blob_b64"])
        if entry.name_sha256 == raw["name_sha256"]:
            return entry
    what = "a ProxyJump hop" if hop else "the destination"
    raise InputError([f"host {host_id}: {what} resolves elsewhere than when discovery presented its key; "
                      "run `deploy-hosts discover` again"])  # fmt: skip


def archive_previous(settings: Settings, run: DiscoveryRun, paths: Iterable[Path]) -> None:
    """Copy the config set as it stands now into `<run>/previous-config/`, before this run changes any of it.

    The set is every file the latest complete run published (its manifest; paths can have moved since) plus
    any file this run replaces that exists; with no earlier run, the inventory that this run itself created
    is not a previous set.
    """
    previous = latest_complete_run(settings, exclude=run.run_dir)
    listed: list[Path] = []
    if previous is not None:
        listed = [settings.root / rel for rel in DiscoveryManifest.load(previous.run_dir).files]
    elif not settings.known_hosts_path.exists():
        return
    for path in dict.fromkeys([*listed, *paths]):
        if path.is_file():
            write_private(run.run_dir / ARCHIVE_DIR / path.name, path.read_bytes())


def publish_config(
    settings: Settings, inventory: Inventory, run: DiscoveryRun, generated: GeneratedConfig
) -> dict[str, str]:
    """Replace the config set and commit this run's host-key enrolments with it; returns path -> SHA-256.

    All-or-nothing by construction (see `configset`); the run's manifest, published last, marks the run
    complete. Two discoveries publishing at once take turns, so the files always form one run's set.
    """
    keep = keep_runs(settings.get(KEEP_RUNS_VARIABLE))
    store = KnownHostsStore(settings.known_hosts_path)
    with publish_lock(settings), store.locked():
        files = {path: text.encode() for path, text in generated.files(settings).items()}
        files[store.path] = store.content_with(staged_enrolments(settings, inventory, run))
        archive_previous(settings, run, files)
        digests = {_relative(settings, path): hashlib.sha256(data).hexdigest() for path, data in files.items()}
        if settings.hosts_path.is_file():
            digests[_relative(settings, settings.hosts_path)] = sha256_file(settings.hosts_path)
        manifest = DiscoveryManifest(config_format=CONFIG_FORMAT, files=digests,
                                     inputs_sha256=discovery_inputs_digest(settings, inventory),
                                     inputs=input_digests(settings, inventory, secrets.token_hex(32)))  # fmt: skip
        files[run.run_dir / MANIFEST_FILE] = render_json(manifest).encode()
        publish_files(settings, run.run_dir, files)
        prune_discovery_runs(settings.discovery_dir, keep, current=run.run_dir.name)
    return digests


def _required(settings: Settings, n: int, name: str) -> str:
    resolved = resolve_engine_field(settings, n, name)
    if not resolved.value:
        raise InputError([f"engine-{n}: {resolved.name} is unset (set it in .env)"])
    return resolved.value


def _write_log(run: DiscoveryRun, host_id: str, text: str, stderr: bytes) -> None:
    extra = printable_block(stderr.decode("utf-8", "replace").strip())
    write_private(run.run_dir / "logs" / f"{host_id}.log", text + (f"\n# probe stderr\n{extra}\n" if extra else ""))


def _first_line(data: bytes) -> str:
    return next((line for line in data.decode("utf-8", "replace").splitlines() if line.strip()), "(no output)")


def _relative(settings: Settings, path: Path) -> str:
    return str(path.relative_to(settings.root)) if path.is_relative_to(settings.root) else str(path)

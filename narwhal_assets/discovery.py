"""Discovery: inspect every physical host over one SSH connection and derive the generated config set.

Flow: enrol host keys (accept-new, staged until the whole discovery succeeds), run the single probe
program per host, keep observations, checkpoint digests and command logs in `runs/discovery/<run>/`,
then build deployment.env, launch records and the fleet from operator settings plus observations and
publish them together. Any failure leaves `config/` exactly as it was.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from narwhal_assets.core.deployment_env import build_deployment_env, render_deployment_env
from narwhal_assets.core.digests import compare_replicas
from narwhal_assets.core.errors import InputError, NarwhalError
from narwhal_assets.core.fleet import Fleet, build_fleet
from narwhal_assets.core.inventory import HostEntry, Inventory, engine_number
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch import EngineLaunchConfig, build_launch_config, launch_sources
from narwhal_assets.core.observations import CheckpointDigest, HostObservation
from narwhal_assets.core.policy import resolve_engine_field
from narwhal_assets.core.prepare_inputs import discovery_inputs_digest
from narwhal_assets.core.profiling import ProfilingLimits, build_profiling_limits
from narwhal_assets.core.settings import DEPLOYMENT_ENV, Layer, Settings
from narwhal_assets.inventory_file import current_inventory
from narwhal_assets.privatefiles import ensure_private_dir, exclusive_lock, sha256_file, write_private
from narwhal_assets.remote import previous_hashes, probe_script
from narwhal_assets.remote.parse import ProbeOutputError, parse_probe_output, render_command_log
from narwhal_assets.ssh.access import host_accesses
from narwhal_assets.ssh.transport import Connector, HostConnection

PROBE_COMMAND = "python3 -"
PROBE_TIMEOUT_S = 3600.0
CHECKPOINT_FILE = "engine-{n}-checkpoint.json"
ARCHIVE_DIR = "previous-config"
MANIFEST = "manifest.json"
PUBLISH_LOCK = ".publish.lock"
PROFILING_LIMITS_FILE = "profiling-limits.json"


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
            if path.name == MANIFEST:
                continue
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("schema") == "narwhal.host-observation":
                obs = HostObservation.model_validate(raw)
                run.observations[obs.host_id] = obs
            elif raw.get("schema") == "narwhal.checkpoint":
                digest = CheckpointDigest.model_validate(raw)
                run.checkpoints[digest.engine] = digest
        return run


@dataclass(frozen=True)
class GeneratedConfig:
    """The discovered config set, validated together before any of it is written."""

    deployment_env: dict[str, str]
    launch: EngineLaunchConfig
    fleet: Fleet
    profiling: ProfilingLimits

    def files(self, settings: Settings) -> dict[Path, str]:
        return {
            settings.root / DEPLOYMENT_ENV: render_deployment_env(self.deployment_env),
            settings.launch_config_path: render_json(self.launch),
            settings.path("NARWHAL_LAUNCH_SOURCES"): render_json(launch_sources(self.launch)),
            settings.fleet_path: render_json(self.fleet),
            profiling_limits_path(settings): render_json(self.profiling),
        }


def profiling_limits_path(settings: Settings) -> Path:
    """`profiling-limits.json` beside the fleet file."""
    return settings.fleet_path.parent / PROFILING_LIMITS_FILE


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
    base = settings.path("NARWHAL_DISCOVERY_DIR")
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
    base = settings.path("NARWHAL_DISCOVERY_DIR")
    manifests = [p for p in base.glob("*/" + MANIFEST) if p.parent != exclude]
    if not manifests:
        return None
    newest = max(manifests, key=lambda p: (p.parent.name.split("-", 1)[0], p.stat().st_mtime_ns, p.parent.name))
    return DiscoveryRun.load(newest.parent)


def probe_request(settings: Settings, entry: HostEntry, previous: Mapping[str, CheckpointDigest], full: bool) -> str:
    """The probe program for one host: its engines' model directories and the engine image reference."""
    engines = [n for n in map(engine_number, entry.roles) if n is not None]
    models = {f"engine-{n}": _required(settings, n, "MODEL_DIR") for n in engines}
    images = {_required(settings, n, "ENGINE_IMAGE") for n in engines}
    if len(images) > 1:
        raise InputError(
            [f"host {entry.id}: colocated engines must use one engine image (NARWHAL_NODE_<n>_ENGINE_IMAGE)"]
        )
    return probe_script(
        {
            "image": images.pop() if images else None,
            "models": models,
            "previous": previous_hashes({e: d for e, d in previous.items() if e in models}),
            "full_hash": full,
        }
    )


def inspect_hosts(
    settings: Settings,
    inventory: Inventory,
    connector: Connector,
    run: DiscoveryRun,
    previous: Mapping[str, CheckpointDigest],
    full_hash: bool = False,
) -> DiscoveryRun:
    """Probe every host in parallel; save what each returned; raise every host's problems together."""
    requests = {entry.id: probe_request(settings, entry, previous, full_hash) for entry in inventory.hosts}
    observed_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def probe(connection: HostConnection) -> tuple[HostObservation, dict[str, CheckpointDigest]]:
        entry = inventory.host(connection.host_id)
        result = connection.run(PROBE_COMMAND, stdin=requests[entry.id].encode(), timeout=PROBE_TIMEOUT_S)
        raw = result.text()
        try:
            parsed = parse_probe_output(entry.id, entry.roles, connection.fingerprint, raw, observed_at)
        except ProbeOutputError as exc:
            _write_log(run, entry.id, render_command_log(exc.command_log), result.stderr)
            if result.rc != 0:
                raise NarwhalError(f"host {entry.id}: probe exited {result.rc}: {_first_line(result.stderr)}") from None
            raise
        observation, digests, log = parsed
        _write_log(run, entry.id, render_command_log(log), result.stderr)
        return observation, digests

    outcomes = connector.map_hosts(host_accesses(settings, inventory.hosts), probe)
    failures: list[NarwhalError] = []
    for host_id, outcome in outcomes.items():
        if isinstance(outcome, NarwhalError):
            failures.append(outcome)
            continue
        observation, digests = outcome
        run.observations[host_id] = observation
        write_private(run.run_dir / f"{host_id}.json", render_json(observation))
        for engine, digest in digests.items():
            run.checkpoints[engine] = digest
            write_private(run.run_dir / CHECKPOINT_FILE.format(n=engine_number(engine)), render_json(digest))
    raise_together(failures)
    compare_replicas(run.checkpoints)
    return run


def raise_together(failures: list[NarwhalError]) -> None:
    """Every host's failure in one error: bad input (exit 2) only if all of them are input problems."""
    if not failures:
        return
    lines = [line for failure in failures for line in str(failure).splitlines()]
    raise InputError(lines) if all(isinstance(f, InputError) for f in failures) else NarwhalError("\n".join(lines))


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
    launch = build_launch_config(
        effective, inventory, run.observations, model_configs=model_configs, observation_dir=str(run.run_dir)
    )
    fleet = build_fleet(effective, inventory, run.observations, launch)
    return GeneratedConfig(discovered, launch, fleet, build_profiling_limits(fleet, launch))


def archive_previous(settings: Settings, run: DiscoveryRun, generated: Iterable[Path]) -> list[Path]:
    """Copy the config set as it stands now into `<run>/previous-config/`, before this run changes any of it.

    The set is every file the latest complete run published (its manifest) plus any generated file that
    exists; with no earlier run, the inventory and trust store that this run itself created are not a
    previous set. A file already archived by this run is kept (the first copy is the previous one).
    """
    previous = latest_complete_run(settings, exclude=run.run_dir)
    listed: list[Path] = []
    if previous is not None:
        manifest = json.loads((previous.run_dir / MANIFEST).read_text(encoding="utf-8"))
        listed = [settings.root / rel for rel in manifest.get("files", {})]
    archive = run.run_dir / ARCHIVE_DIR
    archived = []
    for path in dict.fromkeys([*listed, *generated]):
        target = archive / path.name
        if path.is_file() and not target.exists():
            write_private(target, path.read_bytes())
            archived.append(target)
    return archived


def publish_config(settings: Settings, run: DiscoveryRun, files: Mapping[Path, str]) -> dict[str, str]:
    """Archive the current set into the run (unless already done), replace every file; returns path -> SHA-256.

    Each file is replaced atomically; the manifest written last marks the run as complete. Two discoveries
    publishing at once take turns, so the files on disk always form one run's set.
    """
    with exclusive_lock(settings.path("NARWHAL_DISCOVERY_DIR") / PUBLISH_LOCK):
        archive_previous(settings, run, files)
        digests = {_relative(settings, path): write_private(path, text) for path, text in files.items()}
        for path in (settings.hosts_path, settings.known_hosts_path):
            if path.is_file():
                digests[_relative(settings, path)] = sha256_file(path)
        manifest = {"schema": "narwhal.discovery-manifest", "schema_version": 1, "files": digests,
                    # What `prepare` compares to refuse a config set made from other inputs.
                    "inputs_sha256": discovery_inputs_digest(settings, current_inventory(settings))}  # fmt: skip
        write_private(run.run_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return digests


def generated_paths(settings: Settings) -> list[Path]:
    """Every private file and directory discovery generates in the checkout."""
    return [
        settings.hosts_path,
        settings.known_hosts_path,
        settings.root / DEPLOYMENT_ENV,
        settings.launch_config_path,
        settings.path("NARWHAL_LAUNCH_SOURCES"),
        settings.fleet_path,
        profiling_limits_path(settings),
        settings.path("NARWHAL_DISCOVERY_DIR"),
    ]


def _required(settings: Settings, n: int, name: str) -> str:
    resolved = resolve_engine_field(settings, n, name)
    if not resolved.value:
        raise InputError([f"engine-{n}: {resolved.name} is unset (set it in .env)"])
    return resolved.value


def _write_log(run: DiscoveryRun, host_id: str, text: str, stderr: bytes) -> None:
    extra = stderr.decode("utf-8", "replace").strip()
    write_private(run.run_dir / "logs" / f"{host_id}.log", text + (f"\n# probe stderr\n{extra}\n" if extra else ""))


def _first_line(data: bytes) -> str:
    return next((line for line in data.decode("utf-8", "replace").splitlines() if line.strip()), "(no output)")


def _relative(settings: Settings, path: Path) -> str:
    return str(path.relative_to(settings.root)) if path.is_relative_to(settings.root) else str(path)

"""`prepare`: the published config set as one self-contained, verified prepared run (docs/prepare.md).

Everything that can be wrong with the operator's input is checked before the directory exists: the
revision, the output directory, that discovery saw the current inventory and settings, the revision's
tree, the role exports and the host pins. Then the bundle, the host files and `sources.json` are created
exclusively (0600 in 0700 directories) and `manifest.json` is written last; a failure removes everything.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from narwhal_assets.core.discovery.manifest import CONFIG_FORMAT, DiscoveryManifest, generated_paths
from narwhal_assets.core.errors import InputError, Problems, raise_if
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.jsonfile import load_json_model, render_json
from narwhal_assets.core.launch.fleet import Fleet
from narwhal_assets.core.launch.models import EngineLaunchConfig
from narwhal_assets.core.launch.profiling import ProfilingLimits
from narwhal_assets.core.prepared_run.layout import SOURCES_FILE, PlannedFile, PublishedSet, host_files
from narwhal_assets.core.prepared_run.manifest import (
    MANIFEST_FILE,
    DeploymentManifest,
    ManifestHost,
    PreparedFile,
    PreparedRun,
    remote_dir_for,
)
from narwhal_assets.core.prepared_run.manifest_check import destination_sha256
from narwhal_assets.core.prepared_run.prepare_inputs import (
    changed_inputs,
    check_revision,
    discovery_inputs_digest,
    private_tree_paths,
)
from narwhal_assets.core.prepared_run.role_env import (
    REVISION,
    TOOLS,
    ExportInputs,
    build_role_environments,
    role_sources,
)
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.local.gitsource import create_bundle, resolve_commit, tree_paths
from narwhal_assets.local.privatefiles import DIR_MODE, sha256_file, write_exclusive
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.trust import KnownHostsStore
from narwhal_assets.workflows.discover import latest_complete_run

TOOLS_PACKAGE = "narwhal_assets.host.tools"
NEW_DIRECTORY = "use a new output directory for each deployment"
REDISCOVER = "run `deploy-hosts discover`"


@dataclass(frozen=True)
class Prepared(PreparedRun):
    """A prepared run just made, with the discovery run whose published set it was made from."""

    discovery_run: Path

    def host_digests(self) -> dict[str, dict[str, str]]:
        """Host id -> prepared path -> SHA-256 (for metadata and the command's summary)."""
        return {h.id: {f.path: f.sha256 for f in h.files} for h in self.manifest.hosts}


@dataclass(frozen=True)
class _Host:
    entry: HostEntry
    destination_sha256: str
    fingerprints: list[str]
    files: list[PlannedFile]


@dataclass(frozen=True)
class _Plan:
    revision: str
    hosts: list[_Host]
    sources: bytes
    discovery_run: Path


def prepare(settings: Settings, out: str | None = None) -> Prepared:
    """Validate everything, then write `<out>`; on any failure nothing is left behind."""
    target, plan = _validate(settings, out)
    created = _create(target)
    try:
        return _write(settings, target, plan)
    except BaseException:
        _remove(target, created)
        raise


def check_inputs(settings: Settings, out: str | None = None) -> None:
    """Every check `prepare` makes before writing, writing nothing: `deploy-hosts prepare` runs it before it
    opens the Dagster instance, so bad input leaves neither a failed run nor a file behind."""
    _validate(settings, out)


def output_dir(settings: Settings, out: str | None) -> Path:
    """`--out` (relative to the checkout) must be new or empty; default: a fresh `runs/deployment-env/<time>-<hex>`."""
    if not out:
        name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
        return settings.deployment_env_dir / name
    path = settings.root / Path(out).expanduser()
    if path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir()))):
        raise InputError([f"--out {path}: exists and is not an empty directory; {NEW_DIRECTORY}"])
    return path


def _validate(settings: Settings, out: str | None) -> tuple[Path, _Plan]:
    problems = Problems()
    revision = problems.attempt(check_revision, settings.get(REVISION))
    target = problems.attempt(output_dir, settings, out)
    checkout = problems.attempt(Checkout.from_settings, settings)
    inventory = checkout.inventory if checkout else None
    run = problems.attempt(_discovery_run, settings, inventory) if inventory else None
    if revision:
        problems.attempt(_check_tree, settings, revision)
    raise_if(problems)
    assert revision and target and inventory and run
    return target, _plan(settings, inventory, revision, run)


def _discovery_run(settings: Settings, inventory: Inventory) -> Path:
    """The latest published discovery run, refused unless it used the current inventory and settings."""
    latest = latest_complete_run(settings)
    if latest is None:
        raise InputError([f"no discovery has published a config set in {settings.discovery_dir}; {REDISCOVER}"])
    try:
        manifest = DiscoveryManifest.load(latest.run_dir)
    except InputError as exc:
        raise InputError([f"{problem}; {REDISCOVER}" for problem in exc.problems]) from None
    if manifest.config_format != CONFIG_FORMAT:
        found = manifest.config_format
        raise InputError([f"discovery run {latest.run_dir}: config set discovered with format {found}, re-run "
                          f"discover (this version prepares format {CONFIG_FORMAT}: `deploy-hosts discover`)"])
    if manifest.inputs_sha256 != discovery_inputs_digest(settings, inventory):
        changed = changed_inputs(manifest.inputs, settings, inventory) if manifest.inputs else []
        if changed:  # else a run from before per-input digests
            raise InputError([f"changed since discovery run {latest.run_dir}: {', '.join(changed)}; {REDISCOVER} "
                              "before preparing"])  # fmt: skip
        raise InputError([f"the inventory, destinations or settings differ from those discovery run {latest.run_dir} "
                          f"used; {REDISCOVER} before preparing"])  # fmt: skip
    return latest.run_dir


def _check_tree(settings: Settings, revision: str) -> None:
    resolve_commit(settings.root, revision)
    private = [str(p.relative_to(settings.root)) for p in [*generated_paths(settings), settings.deployment_env_dir]
               if p.is_relative_to(settings.root)]  # fmt: skip
    found = private_tree_paths(tree_paths(settings.root, revision), private)
    if found:
        shown = ", ".join(p if p.isprintable() else ascii(p) for p in found[:5])
        shown += f" and {len(found) - 5} more" if len(found) > 5 else ""
        raise InputError([f"{REVISION}: the tree of {revision} contains private files ({shown}): secrets committed by "
                          "mistake; remove them from history and choose a clean revision"])  # fmt: skip


def _plan(settings: Settings, inventory: Inventory, revision: str, run: Path) -> _Plan:
    problems = Problems()
    fleet = problems.attempt(load_json_model, settings.fleet_path, Fleet)
    launch = problems.attempt(load_json_model, settings.launch_config_path, EngineLaunchConfig)
    problems.attempt(load_json_model, settings.profiling_limits_path, ProfilingLimits)  # shipped as bytes
    raise_if(problems)  # so neither is None
    assert fleet is not None and launch is not None
    tools = {name: resources.files(TOOLS_PACKAGE).joinpath(name).read_bytes() for name in TOOLS.values()}
    observations = {n: str(run / f"{entry.id}.json") for entry in inventory.hosts for n in entry.engine_numbers()}
    inputs = ExportInputs(
        settings=settings, inventory=inventory, fleet=fleet, revision=revision,
        tool_sha256={name: hashlib.sha256(data).hexdigest() for name, data in tools.items()},
        observations=observations, salt=secrets.token_hex(32),
    )  # fmt: skip
    environments = build_role_environments(inputs)
    published = PublishedSet(
        launch=launch,
        fleet_bytes=settings.fleet_path.read_bytes(),
        profiling_limits_bytes=settings.profiling_limits_path.read_bytes(),
        fleet_roles={int(e.iid[1:]): e.role for e in fleet.engines if e.iid[1:].isdigit()},
    )
    by_role = {env.role.name: env for env in environments}
    store = KnownHostsStore(settings.known_hosts_path)
    hosts = []
    for entry in inventory.hosts:
        pins = problems.attempt(_pins, settings, store, entry)
        files = problems.attempt(host_files, entry, by_role, published, tools)
        if pins and files is not None:
            hosts.append(_Host(entry, pins[0], pins[1], files))
    raise_if(problems)
    sources = render_json(role_sources(inputs, environments)).encode("utf-8")
    return _Plan(revision, hosts, sources, run)


def _pins(settings: Settings, store: KnownHostsStore, entry: HostEntry) -> tuple[str, list[str]]:
    """The SHA-256 of the host's destination string and the host-key fingerprints pinned for it."""
    destination = settings.get(entry.ssh_env) or ""
    endpoint = resolve_endpoint(destination, settings.ssh_config_path)
    fingerprints = sorted(set(store.fingerprints(*endpoint.known_host)))
    if not fingerprints:
        raise InputError([f"host {entry.id}: no host key for {endpoint.address} in {store.path}; {REDISCOVER}"])
    return destination_sha256(destination), fingerprints


def _create(target: Path) -> bool:
    """Create the output directory 0700; True when this call created it (so a failure may remove it).

    Missing parents are created 0700; existing ones (an operator's `/tmp`, say) are left as they are.
    """
    if target.is_dir():
        target.chmod(DIR_MODE)
        return False
    for parent in reversed([p for p in target.parents if not p.exists()]):
        parent.mkdir(mode=DIR_MODE, exist_ok=True)
    try:
        target.mkdir(mode=DIR_MODE)
    except FileExistsError:
        raise InputError([f"--out {target}: exists and is not an empty directory; {NEW_DIRECTORY}"]) from None
    target.chmod(DIR_MODE)
    return True


def _write(settings: Settings, target: Path, plan: _Plan) -> Prepared:
    bundle = create_bundle(settings.root, plan.revision, target)
    bundle_file = PreparedFile(path=bundle.name, sha256=sha256_file(bundle), size=bundle.stat().st_size)
    hosts = []
    for host in plan.hosts:
        for planned in host.files:
            write_exclusive(target / planned.path, planned.data)
        hosts.append(ManifestHost(
            id=host.entry.id, ssh_env=host.entry.ssh_env, password_env=host.entry.password_env,
            roles=list(host.entry.roles), destination_sha256=host.destination_sha256,
            host_key_fingerprints=host.fingerprints, files=[f.prepared() for f in host.files],
        ))  # fmt: skip
    sources = PlannedFile(SOURCES_FILE, None, plan.sources)
    write_exclusive(target / sources.path, sources.data)
    deployment_id = uuid.uuid4().hex
    manifest = DeploymentManifest(
        revision=plan.revision,
        deployment_id=deployment_id,
        remote_dir=remote_dir_for(deployment_id),
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        bundle=bundle_file,
        sources=sources.prepared(),
        hosts=hosts,
    )
    write_exclusive(target / MANIFEST_FILE, render_json(manifest))
    return Prepared(target, manifest, plan.discovery_run)


def _remove(target: Path, created: bool) -> None:
    """Undo a failed prepare: the directory if this run created it, else everything this run put in it."""
    if created:
        shutil.rmtree(target, ignore_errors=True)
        return
    for child in target.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)

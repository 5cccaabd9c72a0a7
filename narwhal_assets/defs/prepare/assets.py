"""The `prepare` group: source bundle, role environments and deployment manifest, prepared by one op
(everything is validated before any of the three is written), plus their asset checks."""

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.core.inputs.access_secrets import Scanner, access_needles, host_key_needles
from narwhal_assets.core.prepared_run.layout import SOURCES_FILE
from narwhal_assets.core.prepared_run.manifest import BUNDLE_FILE, MANIFEST_FILE
from narwhal_assets.defs.discovery.assets import KNOWN_HOSTS
from narwhal_assets.defs.keys import DEPLOYMENT_MANIFEST, PREPARE_COMMAND
from narwhal_assets.defs.lineage import latest_metadata, upstream_metadata
from narwhal_assets.defs.resources import ManagementCheckout
from narwhal_assets.local.gitsource import bundle_head
from narwhal_assets.local.privatefiles import non_private
from narwhal_assets.ssh.trust import KnownHostsStore
from narwhal_assets.workflows.prepare import Prepared, prepare

GROUP = "prepare"
SOURCE_BUNDLE = dg.AssetKey("source_bundle")
ROLE_ENVIRONMENTS = dg.AssetKey("role_environments")
OP_NAME = "prepare_deployment"
MAX_SCAN_BYTES = 64 << 20


class PrepareConfig(dg.Config):
    """The same run config serves `deploy-hosts prepare --out DIR` and the UI."""

    out: str = Field(
        default="",
        description="A new (or empty) output directory, relative to the checkout; empty: a fresh directory under "
        "runs/deployment-env/",
    )


@dg.multi_asset(
    name=OP_NAME,
    specs=[
        dg.AssetSpec(SOURCE_BUNDLE, group_name=GROUP, kinds={"git"},
                     description="`<out>/source.bundle`: NARWHAL_DEPLOYMENT_REVISION only, verified by a fresh clone"),
        dg.AssetSpec(ROLE_ENVIRONMENTS, group_name=GROUP, kinds={"shell"},
                     deps=["host_inventory", "deployment_env", "engine_launch_records", "fleet", "profiling_limits"],
                     description="`<out>/<host-id>/`: role files, launch files, tool snapshots, the router's fleet "
                                 "and profiling limits; `<out>/sources.json`"),
        dg.AssetSpec(DEPLOYMENT_MANIFEST, group_name=GROUP, kinds={"json"},
                     deps=[SOURCE_BUNDLE, ROLE_ENVIRONMENTS, KNOWN_HOSTS],
                     description="`<out>/manifest.json` (written last): revision, hosts, pins and every file's hash"),
    ],
)  # fmt: skip
def prepare_deployment(
    context: dg.AssetExecutionContext, config: PrepareConfig, checkout: ManagementCheckout
) -> Iterator[dg.MaterializeResult]:  # type: ignore[type-arg]  # Dagster reads it: the bare class
    prepared = prepare(checkout.open().settings, config.out or None)
    context.log.info(f"prepared deployment {prepared.manifest.deployment_id} in {prepared.run_dir}")
    yield from _results(prepared)


def _results(prepared: Prepared) -> Iterator[dg.MaterializeResult[None]]:
    manifest = prepared.manifest
    common: dict[str, Any] = {
        "out": dg.MetadataValue.path(str(prepared.run_dir)),
        "revision": manifest.revision,
        "deployment_id": manifest.deployment_id,
    }
    yield dg.MaterializeResult(
        asset_key=SOURCE_BUNDLE,
        metadata={**common, "sha256": manifest.bundle.sha256, "size": manifest.bundle.size},
        data_version=dg.DataVersion(manifest.bundle.sha256),
    )
    yield dg.MaterializeResult(
        asset_key=ROLE_ENVIRONMENTS,
        metadata={
            **common,
            "discovery_run": dg.MetadataValue.path(str(prepared.discovery_run)),
            "files_per_host": dg.MetadataValue.json({h.id: len(h.files) for h in manifest.hosts}),
            "sha256": dg.MetadataValue.json(prepared.host_digests()),
            "sources": dg.MetadataValue.path(str(prepared.run_dir / SOURCES_FILE)),
        },
    )
    yield dg.MaterializeResult(
        asset_key=DEPLOYMENT_MANIFEST,
        metadata={
            **common,
            "path": dg.MetadataValue.path(str(prepared.run_dir / MANIFEST_FILE)),
            "remote_dir": manifest.remote_dir,
            "hosts": dg.MetadataValue.json({h.id: h.roles for h in manifest.hosts}),
        },
    )


def latest_out(instance: dg.DagsterInstance, key: dg.AssetKey) -> tuple[Path, str]:
    """The output directory and revision of the latest materialization of a `deployment` asset."""
    return _out(latest_metadata(instance, key, PREPARE_COMMAND))


def checked_out(context: dg.AssetCheckExecutionContext, key: dg.AssetKey) -> tuple[Path, str]:
    """The output directory and revision the check is about: this run's materialization of `key` when the
    run made one (a concurrent prepare must not swap what is checked), else the latest."""
    return _out(upstream_metadata(context.instance, context.run.run_id, key, PREPARE_COMMAND))


def _out(metadata: Mapping[str, dg.MetadataValue]) -> tuple[Path, str]:
    return Path(str(metadata["out"].value)), str(metadata["revision"].value)


@dg.asset_check(asset=SOURCE_BUNDLE, description="source.bundle clones to the approved revision")
def bundle_clones_to_revision(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    out, revision = checked_out(context, SOURCE_BUNDLE)
    try:
        head = bundle_head(out / BUNDLE_FILE)
    except NarwhalError as exc:
        return dg.AssetCheckResult(passed=False, description=f"{out / BUNDLE_FILE}: {exc}")
    return dg.AssetCheckResult(
        passed=head == revision,
        description=f"a clone is at {head}" + ("" if head == revision else f", not at the approved {revision}"),
        metadata={"bundle": dg.MetadataValue.path(str(out / BUNDLE_FILE)), "head": head},
    )


@dg.asset_check(asset=ROLE_ENVIRONMENTS, description="Every prepared file is 0600 in 0700 directories")
def prepared_files_private(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    out, _ = checked_out(context, ROLE_ENVIRONMENTS)
    loose = non_private([out])
    return dg.AssetCheckResult(
        passed=not loose,
        description="\n".join(loose) if loose else "all private",
        metadata={"out": dg.MetadataValue.path(str(out))},
    )


@dg.asset_check(
    asset=ROLE_ENVIRONMENTS,
    description="No prepared file holds a management destination, password, SSH identity or host-key line",
)
def prepared_files_hold_no_access(
    context: dg.AssetCheckExecutionContext, checkout: ManagementCheckout
) -> dg.AssetCheckResult:
    out, _ = checked_out(context, ROLE_ENVIRONMENTS)
    opened = checkout.open()
    store = KnownHostsStore(opened.settings.known_hosts_path)
    scanner = Scanner([*access_needles(opened.settings, opened.inventory), *host_key_needles(store.key_blobs())])
    leaks = []
    scanned = 0
    seen: dict[bytes, list[str]] = {}  # every engine host gets the same tool snapshots: each content scanned once
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name != BUNDLE_FILE:
            scanned += 1
            with path.open("rb") as handle:
                data = handle.read(MAX_SCAN_BYTES)
            key = hashlib.sha256(data).digest()
            if key not in seen:
                seen[key] = scanner.findings(data.decode("utf-8", "replace"))
            leaks += [f"{path.relative_to(out)}: contains {label}" for label in seen[key]]
    return dg.AssetCheckResult(
        passed=not leaks,
        description="\n".join(leaks) if leaks else f"{scanned} files scanned, none holds management access",
        metadata={"out": dg.MetadataValue.path(str(out)), "files_scanned": scanned},
    )


PREPARE_CHECKS = [bundle_clones_to_revision, prepared_files_private, prepared_files_hold_no_access]

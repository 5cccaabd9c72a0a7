"""Discovery assets: host keys, observations and checkpoint digests (one op, one connection per host),
then the generated config set (fleet, launch records, deployment.env) published together."""

from collections.abc import Iterable, Iterator
from pathlib import Path

import dagster as dg

from narwhal_assets.core.discovery.observations import CheckpointDigest, HostObservation
from narwhal_assets.core.errors import NarwhalError, raise_together
from narwhal_assets.core.launch.profiling import max_num_seqs
from narwhal_assets.defs.lineage import upstream_path
from narwhal_assets.defs.names import HOST_POOL
from narwhal_assets.defs.resources import ManagementCheckout, SshSettings
from narwhal_assets.ssh.access import host_accesses
from narwhal_assets.ssh.transport import HostConnection
from narwhal_assets.ssh.trust import TrustMode
from narwhal_assets.workflows.discover import (
    DiscoveryRun,
    check_discovery_inputs,
    generate_config,
    inspect_hosts,
    latest_complete_run,
    new_run_dir,
    operator_settings,
    publish_config,
    stage_enrolments,
)

GROUP = "discovery"
KNOWN_HOSTS = dg.AssetKey("ssh_known_hosts")
OBSERVATIONS = dg.AssetKey("host_observations")
CHECKPOINTS = dg.AssetKey("checkpoint_digests")


class DiscoveryConfig(dg.Config):
    """`full_hash` re-hashes every checkpoint file instead of reusing unchanged files' hashes."""

    full_hash: bool = False


def _enrolment(connection: HostConnection) -> dict[str, str]:
    return {"fingerprint": connection.fingerprint, "outcome": connection.verdict.outcome}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(KNOWN_HOSTS, deps=["host_inventory"], group_name=GROUP, kinds={"ssh"},
                     description="config/ssh.known_hosts: accept-new enrolment of every inventory host"),
        dg.AssetSpec(OBSERVATIONS, deps=[KNOWN_HOSTS], group_name=GROUP, kinds={"json"},
                     description="`runs/discovery/<run>/`: per-host observations and command logs"),
        dg.AssetSpec(CHECKPOINTS, deps=[OBSERVATIONS], group_name=GROUP, kinds={"json"},
                     description="`runs/discovery/<run>/engine-<n>-checkpoint.json`: file hashes and tree digest"),
    ],
    can_subset=True,
    pool=HOST_POOL,
)  # fmt: skip
def host_discovery(
    context: dg.AssetExecutionContext, config: DiscoveryConfig, checkout: ManagementCheckout, ssh: SshSettings
) -> Iterator[dg.MaterializeResult]:  # type: ignore[type-arg]  # Dagster reads it: the bare class
    """Enrol host keys and, unless only the trust store is selected, probe every host over that same connection.

    Enrolments are staged in the run directory: `discovered_config` records them with the config set, so the
    trust store never holds a key from a discovery whose set was not published."""
    opened = checkout.open()
    settings, inventory = operator_settings(opened.settings), opened.inventory
    connector = ssh.connector(settings, TrustMode.ACCEPT_NEW, staged=True)
    if context.selected_asset_keys == {KNOWN_HOSTS}:
        results = connector.map_hosts(host_accesses(settings, inventory.hosts), _enrolment)
        raise_together([r for r in results.values() if isinstance(r, NarwhalError)])
        connector.store.commit()
        yield _known_hosts_result(connector.store.path, {h: r for h, r in results.items() if isinstance(r, dict)})
        return
    check_discovery_inputs(settings, inventory)  # before a run directory exists
    previous = None if config.full_hash else latest_complete_run(settings)  # a full hash reuses nothing
    run = DiscoveryRun(new_run_dir(settings))
    context.log.info(f"discovery run directory {run.run_dir}")
    inspect_hosts(settings, inventory, connector, run, previous.checkpoints if previous else {}, config.full_hash,
                  observed=previous.observations if previous else None)  # fmt: skip
    stage_enrolments(run, connector.store.staged_entries())
    if KNOWN_HOSTS in context.selected_asset_keys:
        staged = {e.host_id for e in connector.store.staged_entries() if not e.hop}
        fingerprints = {
            h: {"fingerprint": o.host_key_fingerprint, "outcome": "staged" if h in staged else "known"}
            for h, o in run.observations.items()
        }
        yield _known_hosts_result(connector.store.path, fingerprints)
    if OBSERVATIONS in context.selected_asset_keys:
        yield dg.MaterializeResult(
            asset_key=OBSERVATIONS,
            metadata={
                "run_dir": dg.MetadataValue.path(str(run.run_dir)),
                "gpus": dg.MetadataValue.json({h: _gpu_summary(o) for h, o in run.observations.items()}),
                "hosts": sorted(run.observations),
            },
        )
    if CHECKPOINTS in context.selected_asset_keys:
        digests = run.checkpoints.values()
        yield dg.MaterializeResult(
            asset_key=CHECKPOINTS,
            metadata={
                "run_dir": dg.MetadataValue.path(str(run.run_dir)),
                "tree_digests": dg.MetadataValue.json({d.engine: d.tree_sha256 for d in digests}),
                "files": dg.MetadataValue.json({d.engine: len(d.files) for d in digests}),
                "bytes_hashed": sum(d.bytes_hashed for d in _distinct_dirs(digests)),
                "bytes_reused": sum(d.bytes_reused for d in _distinct_dirs(digests)),
                "files_reused": sum(d.files_reused for d in _distinct_dirs(digests)),
            },
        )


@dg.multi_asset(
    specs=[
        dg.AssetSpec("deployment_env", deps=[OBSERVATIONS, CHECKPOINTS], group_name=GROUP, kinds={"shell"},
                     description="config/deployment.env: discovered per-node addresses, URLs, image ids, hashes"),
        dg.AssetSpec("engine_launch_records", deps=["deployment_env"], group_name=GROUP, kinds={"json"},
                     description="config/engine-launch.local.json and engine-launch.sources.json"),
        dg.AssetSpec("fleet", deps=["engine_launch_records"], group_name=GROUP, kinds={"json"},
                     description="config/fleet.json: the router's fleet description"),
        dg.AssetSpec("profiling_limits", deps=["fleet", "engine_launch_records"], group_name=GROUP, kinds={"json"},
                     description="config/profiling-limits.json (beside the fleet): each engine's --max-num-seqs"),
    ],
)  # fmt: skip
def discovered_config(
    context: dg.AssetExecutionContext, checkout: ManagementCheckout
) -> Iterator[dg.MaterializeResult]:  # type: ignore[type-arg]  # Dagster reads it: the bare class
    """Build the set (deployment.env, launch records, fleet, profiling limits) once, from the observations of
    this run's `host_observations` (or, run alone, of its latest materialization), and publish it together
    with the staged host keys; the previous set is archived in the run directory."""
    opened = checkout.open()
    settings = operator_settings(opened.settings)
    run = DiscoveryRun.load(upstream_path(context.instance, context.run.run_id, OBSERVATIONS, "run_dir"))
    generated = generate_config(settings, opened.inventory, run)
    digests = publish_config(settings, opened.inventory, run, generated)
    yield dg.MaterializeResult(
        asset_key="deployment_env",
        metadata={"run_dir": dg.MetadataValue.path(str(run.run_dir)), "variables": sorted(generated.deployment_env)},
    )
    yield dg.MaterializeResult(
        asset_key="engine_launch_records",
        metadata={
            "engines": dg.MetadataValue.json(
                {
                    role: {
                        "host": e.host_id,
                        "gpus": e.gpu_ids,
                        "tp": e.tensor_parallel_size,
                        "transport": e.transfer.transport,
                        "max_num_seqs": max_num_seqs(e.runtime.extra_args, role),
                    }
                    for role, e in generated.launch.engines.items()
                }
            ),
        },
    )
    yield dg.MaterializeResult(
        asset_key="fleet",
        metadata={
            "path": dg.MetadataValue.path(str(settings.fleet_path)),
            "engines": dg.MetadataValue.json({e.iid: e.role for e in generated.fleet.engines}),
            "files": dg.MetadataValue.json(digests),
        },
    )
    yield dg.MaterializeResult(
        asset_key="profiling_limits",
        metadata={
            "path": dg.MetadataValue.path(str(settings.profiling_limits_path)),
            "limits": dg.MetadataValue.json(generated.profiling.engines),
        },
    )


def _known_hosts_result(path: Path, fingerprints: dict[str, dict[str, str]]) -> dg.MaterializeResult[None]:
    return dg.MaterializeResult(
        asset_key=KNOWN_HOSTS,
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "fingerprints": dg.MetadataValue.json(fingerprints),
            "added": sorted(h for h, r in fingerprints.items() if r.get("outcome") == "added"),
        },
    )


def _gpu_summary(observation: HostObservation) -> str:
    names = sorted({g.name for g in observation.gpus})
    return f"{len(observation.gpus)}x {', '.join(names)}" if observation.gpus else "no GPUs"


def _distinct_dirs(digests: Iterable[CheckpointDigest]) -> list[CheckpointDigest]:
    """One digest per model directory on a host: engines sharing a directory were hashed once."""
    seen: set[tuple[str, str]] = set()
    unique: list[CheckpointDigest] = []
    for digest in digests:
        if (digest.host_id, digest.model_dir) not in seen:
            seen.add((digest.host_id, digest.model_dir))
            unique.append(digest)
    return unique

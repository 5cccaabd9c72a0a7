"""Asset checks: each can fail, with a description naming the file, field or host at fault."""

import stat

import dagster as dg

from narwhal_assets.assets.discovery import CHECKPOINTS, KNOWN_HOSTS, latest_run_dir
from narwhal_assets.core.digests import compare_replicas
from narwhal_assets.core.errors import InputError
from narwhal_assets.discovery import DiscoveryRun, generated_paths
from narwhal_assets.inventory_file import current_inventory
from narwhal_assets.resources import NarwhalSettings
from narwhal_assets.ssh.access import host_accesses
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.trust import KnownHostsStore


@dg.asset_check(asset=KNOWN_HOSTS, description="Every inventory host has a recorded host key")
def known_hosts_cover_inventory(narwhal: NarwhalSettings) -> dg.AssetCheckResult:
    settings = narwhal.load()
    store = KnownHostsStore(settings.known_hosts_path)
    missing = []
    for access in host_accesses(settings, current_inventory(settings).hosts):
        endpoint = resolve_endpoint(access.destination, settings.ssh_config_path)
        if not store.keys_for(endpoint.host, endpoint.port):
            missing.append(access.host_id)
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"missing_hosts": missing, "store": str(store.path)},
        description=f"no recorded key for: {', '.join(missing)}" if missing else "all hosts recorded",
    )


@dg.asset_check(asset=CHECKPOINTS, description="Engine replicas serve identical checkpoint trees", blocking=True)
def checkpoint_replicas_agree(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    run = DiscoveryRun.load(latest_run_dir(context.instance))
    try:
        compare_replicas(run.checkpoints)
    except InputError as exc:
        return dg.AssetCheckResult(passed=False, description=str(exc), metadata={"run_dir": str(run.run_dir)})
    digests = sorted({d.tree_sha256 for d in run.checkpoints.values()})
    return dg.AssetCheckResult(passed=True, metadata={"run_dir": str(run.run_dir), "tree_digests": digests})


@dg.asset_check(asset="fleet", description="Generated files are 0600 and their directories 0700")
def generated_files_private(narwhal: NarwhalSettings) -> dg.AssetCheckResult:
    settings = narwhal.load()
    loose = []
    for path in generated_paths(settings):
        if not path.exists():
            continue
        want = 0o700 if path.is_dir() else 0o600
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != want:
            loose.append(f"{path}: mode {mode:04o}, expected {want:04o}")
    return dg.AssetCheckResult(
        passed=not loose,
        description="\n".join(loose) if loose else "all private",
        metadata={"checked": len(generated_paths(settings))},
    )

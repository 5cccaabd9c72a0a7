"""`ssh_known_hosts`: accept-new enrolment of every inventory host into the checkout-local store."""

import dagster as dg

from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.inventory_file import current_inventory
from narwhal_assets.privatefiles import sha256_file
from narwhal_assets.resources import NarwhalSettings, SshSettings
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.transport import HostConnection
from narwhal_assets.ssh.trust import KnownHostsStore, TrustMode


def _enrolment(connection: HostConnection) -> dict[str, str]:
    return {"fingerprint": connection.fingerprint, "outcome": connection.verdict.outcome}


@dg.asset(group_name="discovery", deps=["host_inventory"], kinds={"ssh"})
def ssh_known_hosts(narwhal: NarwhalSettings, ssh: SshSettings) -> dg.MaterializeResult:
    """Connect once to every host (accept-new): unknown keys are recorded, changed keys refused."""
    settings = narwhal.load()
    inventory = current_inventory(settings)
    connector = make_connector(
        settings, TrustMode.ACCEPT_NEW, ssh.connect_timeout_s, ssh.command_timeout_s, staged=True
    )
    results = connector.map_hosts(host_accesses(settings, inventory.hosts), _enrolment)
    failures = [str(r) for r in results.values() if isinstance(r, NarwhalError)]
    if failures:
        raise NarwhalError("\n".join(failures))
    connector.store.commit()
    path = connector.store.path
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "fingerprints": dg.MetadataValue.json(results),
            "added": [host for host, r in results.items() if r["outcome"] == "added"],
        },
        data_version=dg.DataVersion(sha256_file(path)),
    )


@dg.asset_check(asset=ssh_known_hosts, description="Every inventory host has a recorded host key")
def known_hosts_cover_inventory(narwhal: NarwhalSettings) -> dg.AssetCheckResult:
    settings = narwhal.load()
    inventory = current_inventory(settings)
    store = KnownHostsStore(settings.known_hosts_path)
    missing = []
    for access in host_accesses(settings, inventory.hosts):
        endpoint = resolve_endpoint(access.destination, settings.ssh_config_path)
        if not store.keys_for(endpoint.host, endpoint.port):
            missing.append(access.host_id)
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"missing_hosts": missing, "store": str(store.path)},
        description=f"no recorded key for: {', '.join(missing)}" if missing else "all hosts recorded",
    )

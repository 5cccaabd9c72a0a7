"""Asset check on the checkout-local trust store (enrolment itself happens in `host_discovery`)."""

import dagster as dg

from narwhal_assets.assets.discovery import KNOWN_HOSTS
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

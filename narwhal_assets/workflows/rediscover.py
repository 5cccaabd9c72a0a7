"""Rediscovery: the drift probe over one strict SSH connection per host, parsed and compared with a discovery run.

Strict trust: a host whose key changed is refused (reported as host-key drift, never enrolled). A host
that cannot be reached is reported as not checked; neither is retried here.
"""

from __future__ import annotations

from narwhal_assets.core.discovery.drift import HOST_KEY, INVENTORY, Change, DriftReport, DriftSnapshot, compare_host
from narwhal_assets.core.errors import HostKeyError, NarwhalError
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.launch.policy import parse_interface, resolve_engine_field
from narwhal_assets.host import program_stream
from narwhal_assets.protocols.drift import DRIFT_PROGRAM, drift_script, parse_drift_output
from narwhal_assets.ssh.access import host_accesses
from narwhal_assets.ssh.transport import Connector, HostConnection
from narwhal_assets.workflows.discover import DiscoveryRun

DRIFT_TIMEOUT_S = 45.0  # under Dagster's 60 s sensor evaluation limit (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS)


def fabric_interfaces(settings: Settings, entry: HostEntry) -> list[str]:
    """The fabric interface of each engine on the host (router-only hosts have none)."""
    return sorted({parse_interface(resolve_engine_field(settings, n, "FABRIC_INTERFACE"), n)
                   for n in entry.engine_numbers()})  # fmt: skip


def check_drift(settings: Settings, inventory: Inventory, run: DiscoveryRun, connector: Connector) -> DriftReport:
    """Probe every inventory host that the run observed, in parallel, and compare; never writes anything."""
    report = DriftReport(run_dir=run.run_dir.name)
    for entry in inventory.hosts:
        if entry.id not in run.observations:
            report.drift[entry.id] = [Change(INVENTORY, "not observed by the latest discovery")]
    entries = [entry for entry in inventory.hosts if entry.id in run.observations]
    fabric = {entry.id: fabric_interfaces(settings, entry) for entry in entries}

    def probe(connection: HostConnection) -> DriftSnapshot:
        observation = run.observations[connection.host_id]
        stream = program_stream(drift_script(observation))
        result = connection.run_program(DRIFT_PROGRAM, stream, timeout=DRIFT_TIMEOUT_S)
        return parse_drift_output(connection.host_id, connection.fingerprint, result.text(),
                                  fabric[connection.host_id], observation)  # fmt: skip

    for host_id, outcome in connector.map_hosts(host_accesses(settings, entries), probe).items():
        if isinstance(outcome, HostKeyError):
            report.drift[host_id] = [Change(HOST_KEY, f"{_first_line(outcome)} (refused; discovery will not enrol it)")]
        elif isinstance(outcome, NarwhalError):
            report.unreachable[host_id] = _first_line(outcome)
        else:
            digests = {e: d for e, d in run.checkpoints.items() if d.host_id == host_id}
            changes = compare_host(run.observations[host_id], digests, outcome)
            report.files_checked += sum(len(m.files) for m in outcome.models.values())
            report.bytes_read += sum(m.bytes_read for m in outcome.models.values())
            if changes:
                report.drift[host_id] = changes
            else:
                report.unchanged.append(host_id)
    return report


def _first_line(exc: Exception) -> str:
    return next(iter(str(exc).splitlines()), type(exc).__name__)

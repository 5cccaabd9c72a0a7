"""Simulated test fleet: network namespaces running real OpenSSH servers with faked GPU hardware.

Used by the `fleet`-marked tests and the README demo (`python -m fleetsim`). Needs root.
"""

from fleetsim.fleet import SimFleet, SimHost
from fleetsim.hardware import FakeGpu
from fleetsim.system import FleetError, missing_prerequisites

__all__ = ["FakeGpu", "FleetError", "SimFleet", "SimHost", "missing_prerequisites"]

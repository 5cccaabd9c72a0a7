"""Simulated test fleet: network namespaces running real OpenSSH servers with faked GPU hardware.

Used by the `fleet`-marked tests and the README demo (`python -m narwhal_assets.fleetsim`). Needs root.
"""

from narwhal_assets.fleetsim.fleet import SimFleet, SimHost
from narwhal_assets.fleetsim.hardware import FakeGpu
from narwhal_assets.fleetsim.system import FleetError, missing_prerequisites

__all__ = ["FakeGpu", "FleetError", "SimFleet", "SimHost", "missing_prerequisites"]

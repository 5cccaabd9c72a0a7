"""The browser test reuses the fleet fixtures (and the discovery test's model fleet and sentinel ssh config)."""

from fleet.conftest import checkout_env, sim_fleet_factory  # noqa: F401
from fleet.test_discovery import checkout, fleet, ssh_config  # noqa: F401

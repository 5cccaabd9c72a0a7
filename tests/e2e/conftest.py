"""The browser test reuses the fleet fixtures (and the discovery test's model fleet and sentinel ssh config).

The fleet test modules import one another by module name (`from test_discovery import ...`), as pytest makes
possible when it collects them; the browser test imports them the same way, so each is loaded once.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))

from fleet.conftest import checkout_env, sim_fleet_factory  # noqa: F401
from test_discovery import checkout, fleet, ssh_config  # noqa: F401

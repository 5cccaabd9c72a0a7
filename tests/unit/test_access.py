"""Connections built from the checkout's settings (`ssh/access.py`): keep-alive and host-timeout bounds are
checked against their ranges, naming the variable, before any host is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.env_checkout import write_checkout

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.ssh.access import make_connector, transport_bounds
from narwhal_assets.ssh.trust import TrustMode


@pytest.mark.parametrize(
    ("name", "value"),
    [("NARWHAL_SSH_ALIVE_INTERVAL", "0"), ("NARWHAL_SSH_ALIVE_INTERVAL", "soon"),
     ("NARWHAL_SSH_ALIVE_COUNT", "2.5"), ("NARWHAL_SSH_HOST_TIMEOUT", "-1")],
)  # fmt: skip
def test_transport_bounds_out_of_range_exit_2_naming_the_variable(tmp_path: Path, name: str, value: str) -> None:
    root = write_checkout(tmp_path / "c", f"{name}={value}")
    with pytest.raises(InputError, match=f"^{name}: must be"):
        transport_bounds(Settings.load(root))
    good = write_checkout(tmp_path / "g", "NARWHAL_SSH_ALIVE_INTERVAL=1.5", "NARWHAL_SSH_ALIVE_COUNT=2")
    connector = make_connector(Settings.load(good), TrustMode.STRICT)
    assert (connector.alive_interval, connector.alive_count, connector.host_timeout) == (1.5, 2, 3600.0)

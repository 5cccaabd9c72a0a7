"""Artifacts name host ids, never destinations: a discovery through an aliased ProxyJump leaves no alias in runs/.

Fleet: h1, a bastion that is no inventory host, and h2 (router + engine-1) and h3 (engine-2), each reachable only
through h1. The destinations in `.env` and the ProxyJump hop are sentinel ssh-config aliases, so any artifact
that kept one is found by a byte scan: the staged host keys once held the hop's alias as its `host_id`, and
which host's connection staged the shared hop depends on connection order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import discover
from helpers.files import assert_nowhere
from helpers.fleet_checkout import MODEL, MODEL_CONFIG, MODEL_DIR, WEIGHTS

from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.trust import KnownHostsStore

TARGETS = {"h2": "dest-sentinel-m4rq-two", "h3": "dest-sentinel-m4rq-three"}
JUMP = "dest-sentinel-m4rq-jump"


@pytest.fixture(scope="module")
def fleet(sim_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    fleet = sim_fleet_factory()
    fleet.add_host("h1")
    fleet.add_host("h2", via="h1")
    fleet.add_host("h3", via="h1")
    fleet.start()
    fleet.write_model(MODEL, WEIGHTS, MODEL_CONFIG)
    return fleet


def alias_block(fleet: SimFleet, alias: str, name: str, jump: str | None = None) -> str:
    host = fleet.host(name)
    lines = [f"HostName {host.address}", f"User {host.user}", f"Port {host.port}",
             f"IdentityFile {fleet.client_key_path}", "IdentitiesOnly yes"]  # fmt: skip
    lines += [f"ProxyJump {jump}"] if jump else []
    return f"Host {alias}\n" + "".join(f"    {line}\n" for line in lines)


def test_staged_host_keys_of_a_proxyjump_hop_name_the_inventory_host(
    tmp_path: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh_config = tmp_path / "ssh_config"  # outside the checkout: the scan covers only what narwhal wrote
    blocks = [alias_block(fleet, JUMP, "h1"), *(alias_block(fleet, a, name, JUMP) for name, a in TARGETS.items())]
    ssh_config.write_text("\n".join(blocks))
    root = tmp_path / "checkout"
    root.mkdir()
    settings = {"NARWHAL_ROUTER_SSH": TARGETS["h2"], "NARWHAL_NODE_1_SSH": TARGETS["h2"],
                "NARWHAL_NODE_2_SSH": TARGETS["h3"], "NARWHAL_SSH_CONFIG": str(ssh_config),
                "NARWHAL_ENGINE_IMAGE": fleet.host("h2").image_ref, "NARWHAL_ENGINE_MODEL_NAME": MODEL,
                "NARWHAL_MODEL_DIR": MODEL_DIR, "NARWHAL_RUN_DIR": "/var/tmp/narwhal-run",
                "NARWHAL_FABRIC_INTERFACE": "fab0"}  # fmt: skip
    (root / ".env").write_text("".join(f"{name}={value}\n" for name, value in settings.items()))

    run = discover(root, capsys)

    staged = json.loads((run / "staged-known-hosts.json").read_text(encoding="utf-8"))
    host_ids = set(Checkout.open(root).inventory.host_ids())
    assert len(host_ids) == 2
    assert {key["host_id"] for key in staged["keys"] if not key["hop"]} == host_ids
    [hop] = [key for key in staged["keys"] if key["hop"]]  # the shared bastion, staged by whichever came first
    assert hop["host_id"] in host_ids
    store = KnownHostsStore(root / "config" / "ssh.known_hosts")
    for name in ("h1", "h2", "h3"):  # the hop's key was recorded under its own address, resolved again at publish
        host = fleet.host(name)
        assert store.fingerprints(host.address, host.port), name
    assert_nowhere([*TARGETS.values(), JUMP], [root / "runs", Path(os.environ["DAGSTER_HOME"])])

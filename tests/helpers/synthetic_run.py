"""A discovered and prepared management checkout from synthetic observations, without a fleet: the real
publish and `prepare` code paths over a git checkout, so the files are exactly what an operator gets."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from helpers.git_repo import git_checkout
from helpers.launch_inputs import observation, rdma_port
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.workflows.discover import DiscoveryRun, generate_config, new_run_dir, publish_config
from narwhal_assets.workflows.prepare import Prepared, prepare

ADDRESSES = {"node-1": "198.18.0.1", "node-3": "198.18.0.3"}
# node-1: the router and two colocated engines; node-3: one engine over RDMA.
ENV = {
    "NARWHAL_ROUTER_SSH": "ops@198.18.0.1", "NARWHAL_NODE_1_SSH": "ops@198.18.0.1",
    "NARWHAL_NODE_2_SSH": "ops@198.18.0.1", "NARWHAL_NODE_3_SSH": "ops@198.18.0.3",
    "NARWHAL_NODE_3_SSH_PASSWORD": "SENTINEL-pw-contract",
    "NARWHAL_ENGINE_IMAGE": "registry.example/engine:2025.11", "NARWHAL_ENGINE_MODEL_NAME": "demo",
    "NARWHAL_MODEL_DIR": "/srv/models/demo", "NARWHAL_RUN_DIR": "/var/tmp/narwhal-run",
    "NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_ENGINE_API_KEY": "engine key 'quoted' $(not run)",
    "NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_NODE_2_GPU_IDS": "2,3", "NARWHAL_NODE_2_ENGINE_PORT": "8100",
    "NARWHAL_NODE_2_ATTEST_PORT": "8101", "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5700",
    "NARWHAL_NODE_2_UCX_TCP_PORT_RANGE": "51000-51999", "NARWHAL_NODE_3_TRANSFER_TRANSPORT": "ucx_rdma",
    "NARWHAL_EXTRA_ENGINE_ARGS": "--max-num-batched-tokens 8192", "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=INFO",
}  # fmt: skip


@dataclass(frozen=True)
class SyntheticRun:
    root: Path
    settings: Settings
    prepared: Prepared


def host_key_line(address: str, seed: int) -> str:
    """An ssh-ed25519 known-hosts line (a well-formed blob; no host ever presents it)."""
    raw = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + seed.to_bytes(32, "big")
    return f"{address} ssh-ed25519 {base64.b64encode(raw).decode()}"


def synthetic_run(root: Path) -> SyntheticRun:
    """Discover (from observations) and prepare the fleet of ENV under `root`."""
    root.mkdir(parents=True)
    revision = git_checkout(root)
    quote = "'\\''"  # a single quote inside single quotes, as bash reads it
    lines = [f"{name}='{value.replace(chr(39), quote)}'" for name, value in ENV.items()]
    (root / ".env").write_text("\n".join([*lines, f"NARWHAL_DEPLOYMENT_REVISION={revision}"]) + "\n")
    (root / "config").mkdir(mode=0o700)
    known = "".join(host_key_line(address, n) + "\n" for n, address in enumerate(ADDRESSES.values()))
    (root / "config" / "ssh.known_hosts").write_text(known)
    checkout = Checkout.from_settings(Settings.load(root, environ={}))  # the checkout alone decides
    checkout.save_inventory()
    observations = {
        "node-1": observation("node-1", ["router", "engine-1", "engine-2"], gpus=4, ip=ADDRESSES["node-1"]),
        "node-3": observation("node-3", ["engine-3"], gpus=2, ip=ADDRESSES["node-3"], rdma=[rdma_port()]),
    }
    run = DiscoveryRun(new_run_dir(checkout.settings), observations=observations)
    publish_config(checkout.settings, checkout.inventory, run, generate_config(checkout.settings, checkout.inventory,
                                                                               run))  # fmt: skip
    settings = Settings.load(root, environ={})
    return SyntheticRun(root, settings, prepare(settings, "runs/deployment-env/contract"))

"""The model fleet most fleet tests share, and management checkouts wired to it.

h1 (router + engine-1, key auth), h2 (engine-2, PASSWORD auth), h3 (engine-3, key auth), each serving the same
model at MODEL_DIR. Destinations are sentinel ssh-config aliases, so a leak of a destination value is detectable.
"""

from __future__ import annotations

import random
from pathlib import Path

from fleetsim import SimFleet

PASSWORD = "pw-SENTINEL-d15c0v3ry-41c9"
DESTINATIONS = {"h1": "mgmt-sentinel-q7zk-a", "h2": "mgmt-sentinel-q7zk-b", "h3": "mgmt-sentinel-q7zk-c"}
ROLES = {"router": "h1", "engine-1": "h1", "engine-2": "h2", "engine-3": "h3"}
HOST_IDS = {"h1": "node-1", "h2": "node-2", "h3": "node-3"}
ENGINE_HOSTS = {1: "h1", 2: "h2", 3: "h3"}
MODEL = "demo-model"
MODEL_DIR = f"/srv/models/{MODEL}"
MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16", "num_attention_heads": 32, "hidden_size": 4096}  # fmt: skip
_rng = random.Random(20251130)
WEIGHTS = {
    "model-00001-of-00002.safetensors": _rng.randbytes(3 << 20),
    "model-00002-of-00002.safetensors": _rng.randbytes(2 << 20),
    "model.safetensors.index.json": b'{"weight_map": {}}\n',
    "tokenizer/tokenizer.json": _rng.randbytes(256 << 10),
    "tokenizer/special tokens.txt": b"<s>\n</s>\n",
    "-rank0.bin": _rng.randbytes(4096),
}
LINKS = {"tokenizer.json": "tokenizer/tokenizer.json"}  # followed like `find -L`
TOUCHED = "model-00002-of-00002.safetensors"


def make_checkout(root: Path, fleet: SimFleet, ssh_config: Path, roles: dict[str, str] = ROLES, **extra: str) -> Path:
    """A management checkout whose .env holds the sentinel destinations, the password and engine settings."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for role, name in roles.items():
        variable = "NARWHAL_ROUTER_SSH" if role == "router" else f"NARWHAL_NODE_{role.split('-')[1]}_SSH"
        lines.append(f"{variable}={DESTINATIONS[name]}")
        if fleet.host(name).password is not None:
            lines.append(f"{variable}_PASSWORD={PASSWORD}")
    settings = {"NARWHAL_SSH_CONFIG": str(ssh_config), "NARWHAL_ENGINE_IMAGE": fleet.host("h1").image_ref,
                "NARWHAL_ENGINE_MODEL_NAME": MODEL, "NARWHAL_MODEL_DIR": MODEL_DIR,
                "NARWHAL_RUN_DIR": "/var/tmp/narwhal-run", "NARWHAL_FABRIC_INTERFACE": "fab0", **extra}  # fmt: skip
    lines += [f"{name}={value}" for name, value in settings.items()]
    (root / ".env").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def set_env(root: Path, **values: str) -> None:
    with (root / ".env").open("a") as env:
        env.writelines(f"{name}='{value}'\n" for name, value in values.items())

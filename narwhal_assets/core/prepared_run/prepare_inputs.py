"""What `prepare` checks before it writes anything: the revision, the tree it names, and that the settings
discovery derived the published config set from are still the current ones.

The discovery-inputs digest covers exactly what discovery reads: the inventory, the destinations, the
launch-policy and fleet settings, and the paths of the generated files. Passwords, the revision and other
prepare-only settings are not in it, so changing them needs no new discovery. The same inputs digested one
by one (`input_digests`) let `prepare` name those that changed, never showing a value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from narwhal_assets.core.discovery.manifest import InputDigests
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import Inventory
from narwhal_assets.core.inputs.settings import PATH_DEFAULTS, Layer, Settings
from narwhal_assets.core.launch.fleet import API_KEY_ENV, engine_credential
from narwhal_assets.core.launch.policy import FIELDS
from narwhal_assets.core.prepared_run.manifest import REVISION_RE
from narwhal_assets.core.roles import ROUTER_SSH, node_variable

REVISION = "NARWHAL_DEPLOYMENT_REVISION"
REVISION_FIX = "set NARWHAL_DEPLOYMENT_REVISION=$(git rev-parse HEAD) (the full commit id to deploy)"
PREPARE_ONLY_PATHS = frozenset({"NARWHAL_DEPLOYMENT_ENV_DIR"})
# Per-node inputs: the launch policy fields, the serving role, the destination, and the node's fabric address
# and service URLs, which discovery checks and records (changing one afterwards needs a new discovery).
_NODE_FIELDS = frozenset({f.name for f in FIELDS} | {"ROLE", "SSH", "IP", "URL", "ATTESTATION_URL"})
DOTENV_NAME = ".env"
# The discovery inputs that are not variables, by their name in `InputDigests`.
INVENTORY_INPUT = "inventory"
CREDENTIAL_INPUT = "engine_credential"


def check_revision(value: str | None) -> str:
    """A full 40- or 64-hex commit id (lower-cased); anything else is an error with the fix."""
    if not value:
        raise InputError([f"{REVISION} is unset; {REVISION_FIX}"])
    revision = value.strip().lower()
    if not REVISION_RE.fullmatch(revision):
        raise InputError([f"{REVISION} must be a full 40- or 64-hex commit id, not a branch, tag or short id; "
                          f"{REVISION_FIX}"])
    return revision


def discovery_inputs(settings: Settings, inventory: Inventory) -> dict[str, Any]:
    """The inputs discovery derives the config set from; the discovered layer itself is not one of them."""
    operator = Settings(settings.root, tuple((layer, v) for layer, v in settings.layers if layer != Layer.DISCOVERED))
    names = {*PATH_DEFAULTS, "NARWHAL_SSH_CONFIG", API_KEY_ENV, ROUTER_SSH, *(f.variable for f in FIELDS)}
    names -= PREPARE_ONLY_PATHS
    names |= {name for name in operator.names() if (node := node_variable(name)) and node[1] in _NODE_FIELDS}
    credential = engine_credential(operator)
    return {
        "inventory": inventory.model_dump(by_alias=True, mode="json"),
        "settings": {name: value for name in sorted(names) if (value := operator.get(name)) is not None},
        "engine_credential": credential.engine_api_key_env if credential else None,
    }


def discovery_inputs_digest(settings: Settings, inventory: Inventory) -> str:
    """SHA-256 of `discovery_inputs`, recorded in the discovery manifest and compared by `prepare`."""
    return hashlib.sha256(_canonical(discovery_inputs(settings, inventory))).hexdigest()


def input_digests(settings: Settings, inventory: Inventory, salt: str) -> InputDigests:
    """`discovery_inputs` one by one: each variable, the inventory and the credential's variable, by name ->
    HMAC-SHA256 of the name and value keyed by `salt` (hex)."""
    inputs = discovery_inputs(settings, inventory)
    named = {**inputs["settings"], INVENTORY_INPUT: inputs["inventory"], CREDENTIAL_INPUT: inputs["engine_credential"]}
    key = bytes.fromhex(salt)
    return InputDigests(salt=salt, digests={
        name: hmac.new(key, _canonical([name, value]), hashlib.sha256).hexdigest() for name, value in named.items()
    })  # fmt: skip


def changed_inputs(recorded: InputDigests, settings: Settings, inventory: Inventory) -> list[str]:
    """The discovery inputs whose value differs now from the one `recorded` digested, by name (a variable set
    or unset since then says so); never a value."""
    now = input_digests(settings, inventory, recorded.salt).digests
    labels = {INVENTORY_INPUT: f"the inventory ({settings.hosts_path})",
              CREDENTIAL_INPUT: "the engine credential's variable"}  # fmt: skip
    changed = []
    for name in sorted(recorded.digests.keys() | now.keys()):
        if recorded.digests.get(name) != now.get(name):
            state = " (unset since)" if name not in now else " (set since)" if name not in recorded.digests else ""
            changed.append(labels.get(name, name) + state)
    return changed


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def private_tree_paths(tree: Iterable[str], private: Iterable[str]) -> list[str]:
    """Paths of a commit's tree that must never be shipped: any file named `.env`, and every private file
    the settings name (given relative to the checkout; a directory covers everything below it)."""
    named = [PurePosixPath(p) for p in private]
    found = []
    for path in tree:
        pure = PurePosixPath(path)
        if pure.name == DOTENV_NAME or any(pure == p or p in pure.parents for p in named):
            found.append(path)
    return found

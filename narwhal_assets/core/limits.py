"""Documented maxima for every operator value: one table, enforced where values are read.

An absurd value (a 1 MB model name, a 100 KB password) must fail with exit 2 naming the variable, not
flow into generated files or through pipes. `docs/limits.md` lists this table and
a unit test keeps the two equal. Sizes are UTF-8 bytes. Values whose format is checked elsewhere (ports,
hashes, choices) are bounded by that format as well.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal_assets.core.roles import node_variable

PREFIX = "NARWHAL_"
DOCS = "docs/limits.md"


@dataclass(frozen=True)
class Limit:
    """A maximum for the variables whose field (the name after `NARWHAL_` or `NARWHAL_NODE_<n>_`) is listed."""

    fields: tuple[str, ...]
    maximum: int
    why: str


ENV_FILE_BYTES = 1 << 20
ENV_FILE_LINES = 10_000
INVENTORY_FILE_BYTES = 1 << 20
# Any value without a specific limit: every assignment in an assignment file, every NARWHAL_* variable.
VALUE_BYTES = 8192

PATH_FIELDS = (
    "HOSTS",
    "SSH_KNOWN_HOSTS",
    "FLEET",
    "LAUNCH_CONFIG",
    "LAUNCH_SOURCES",
    "DISCOVERY_DIR",
    "DEPLOYMENT_ENV_DIR",
    "SSH_CONFIG",
)
LIMITS: tuple[Limit, ...] = (
    Limit(("ENGINE_MODEL_NAME",), 256, "served model name; a Hugging Face repository name is at most 96 characters"),
    Limit(("ENGINE_IMAGE",), 512, "Docker: a name of 255 characters, a tag of 128, plus `@sha256:<64 hex>`"),
    Limit(("MODEL_DIR", "RUN_DIR"), 1024, "host directories; mounted into the container and written to launch files"),
    Limit(("GPU_IDS",), 2048, "32 GPU UUIDs (40 characters each) with commas take 1311 bytes"),
    Limit(("EXTRA_ENGINE_ARGS", "ENGINE_ENV"), 4096, "a few dozen allow-listed flags or variables"),
    Limit(("ROUTER_SSH", "SSH"), 1024, "an ssh alias or `user@host`; a DNS name is at most 253 characters"),
    Limit(("ROUTER_SSH_PASSWORD", "SSH_PASSWORD"), 512, "Linux-PAM takes at most 512 bytes (PAM_MAX_RESP_SIZE)"),
    Limit(PATH_FIELDS, 4095, "PATH_MAX (4096 bytes with the terminating NUL)"),
)
_BY_FIELD = {name: limit for limit in LIMITS for name in limit.fields}


def field_of(name: str) -> str | None:
    """`NARWHAL_NODE_2_RUN_DIR` and `NARWHAL_RUN_DIR` -> `RUN_DIR`; a name outside `NARWHAL_*` -> None."""
    node = node_variable(name)
    if node is not None:
        return node[1]
    return name.removeprefix(PREFIX) if name.startswith(PREFIX) else None


def maximum(name: str) -> int:
    """The most UTF-8 bytes variable `name` may hold."""
    field = field_of(name)
    limit = _BY_FIELD.get(field) if field else None
    return limit.maximum if limit else VALUE_BYTES


def too_long(name: str, value: str) -> str | None:
    """The problem (without location) when `value` exceeds `name`'s maximum; never quotes the value."""
    limit = maximum(name)
    # A str of n characters is at least n bytes: the encode is skipped for the huge values it refuses anyway.
    if len(value) > limit or len(value.encode("utf-8", "surrogatepass")) > limit:
        return f"{name}: value is longer than {limit} bytes (see {DOCS})"
    return None

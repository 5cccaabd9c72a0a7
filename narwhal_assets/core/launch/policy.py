"""Launch policy: every engine setting, its documented default, and how one engine's value is resolved.

One table (`FIELDS`) drives resolution, the source index and `docs/launch-policy.md`, so a variable cannot
be honoured in one place and missing in another. A per-node variable `NARWHAL_NODE_<n>_<FIELD>` is more
specific than the fleet-wide `NARWHAL_<FIELD>` and wins whatever layer either comes from: discovery pins
per-node values (image id, config hash) in `config/deployment.env`, and a fleet-wide tag in `.env` must
not undo that pin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from narwhal_assets.core import limits
from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import Layer, Settings
from narwhal_assets.core.records import SHA256_RE

PREFIX = "NARWHAL_"
# Names that look like credentials never enter an engine's environment or command line.
CREDENTIAL_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|SSH|CREDENTIAL|PRIVATE|AUTH", re.IGNORECASE)


class SourceLayer(StrEnum):
    """Where a resolved launch value came from (the `sources` of a launch record)."""

    DEFAULT = "default"
    DISCOVERED = "discovered"
    DOTENV = "dotenv"
    PROCESS = "process"
    NODE_OVERRIDE = "node-override"


class Source(BaseModel):
    """One entry of the source index: layer, the variable that set it, the observation it was derived from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: SourceLayer
    variable: str | None = None
    observation: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class PolicyField:
    """One launch setting. `required` marks the ten engine fields every engine role file exports."""

    name: str
    default: str | None
    meaning: str
    required: bool = False

    @property
    def variable(self) -> str:
        return f"{PREFIX}{self.name}"

    def node_variable(self, n: int) -> str:
        return f"{PREFIX}NODE_{n}_{self.name}"

    @property
    def key(self) -> str:
        """The key of this field in the source index."""
        return self.name.lower()


FIELDS: tuple[PolicyField, ...] = (
    PolicyField(
        "ENGINE_IMAGE",
        None,
        "engine image, pinned: `sha256:<64 hex>` or `<name>@sha256:<64 hex>`; "
        "discovery pins it per node as the observed image id",
        required=True,
    ),
    PolicyField("ENGINE_MODEL_NAME", None, "served model name (`--served-model-name`, fleet `model`)", required=True),
    PolicyField(
        "MODEL_DIR",
        None,
        "absolute model directory on the engine host, mounted read-only at the same path",
        required=True,
    ),
    PolicyField("RUN_DIR", None, "engine run directory on the host (cache captures, logs)", required=True),
    PolicyField(
        "MODEL_CONFIG_SHA256",
        None,
        "SHA-256 of `MODEL_DIR/config.json`; discovery records it per node; setting it in `.env` pins it",
        required=True,
    ),
    PolicyField(
        "FABRIC_INTERFACE",
        None,
        "interface carrying KV-cache transfer; its global address is the node's fabric IP",
        required=True,
    ),
    PolicyField("ENGINE_PORT", "8000", "engine HTTP port (`--port`)", required=True),
    PolicyField("ATTEST_PORT", "8001", "attestation endpoint port", required=True),
    PolicyField(
        "NIXL_SIDE_CHANNEL_PORT",
        "5600",
        "NIXL side-channel base port; one more port per TP rank above it is reserved",
        required=True,
    ),
    PolicyField("UCX_TCP_PORT_RANGE", "50000-50999", "`UCX_TCP_PORT_RANGE` `A-B`, at most 2049 ports", required=True),
    PolicyField(
        "MAX_MODEL_LEN", "16384", "`--max-model-len`; the default is capped by the model's `max_position_embeddings`"
    ),
    PolicyField("MAX_NUM_SEQS", "8", "`--max-num-seqs` (also the profiling limit)"),
    PolicyField("GPU_MEMORY_UTILIZATION", "0.9", "`--gpu-memory-utilization`, in (0, 1]"),
    PolicyField("KV_BLOCK_SIZE", "128", "`--block-size` (KV-cache block, tokens)"),
    PolicyField("KV_CACHE_DTYPE", "auto", "`--kv-cache-dtype`: `auto`, the only one the fleet's launcher runs"),
    PolicyField(
        "MODEL_DTYPE",
        None,
        "`--dtype` (`runtime.model_dtype`): bfloat16 or float16; default: the model config's `dtype` or "
        "`torch_dtype`, else bfloat16",
    ),
    PolicyField("ENFORCE_EAGER", "1", "`--enforce-eager` when 1 (eager execution), omitted when 0"),
    PolicyField(
        "TRANSFER_TRANSPORT",
        "ucx_tcp",
        "`ucx_tcp` or `ucx_rdma` (needs an ACTIVE RDMA port and its verbs device under /dev/infiniband)",
    ),
    PolicyField(
        "UCX_GPU_TLS",
        "cuda",
        "the GPU transport in `UCX_TLS` (`transfer.gpu_tls`): `cuda` (copy and IPC) or `cuda_copy`",
    ),
    PolicyField(
        "TENSOR_PARALLEL_SIZE",
        None,
        "`--tensor-parallel-size`, 1..allocated GPUs; default: the number of allocated GPUs",
    ),
    PolicyField(
        "GPU_IDS",
        None,
        "comma-separated GPU indices or UUIDs; default: every observed GPU; required "
        "per node (`NARWHAL_NODE_<n>_GPU_IDS`) for engines that share a host",
    ),
    PolicyField("EXTRA_ENGINE_ARGS", "", "extra engine flags, shell-quoted; each flag must be allow-listed"),
    PolicyField("ENGINE_ENV", "", "extra engine environment, shell-quoted `NAME=value` words; names allow-listed"),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
REQUIRED_FIELDS = tuple(f for f in FIELDS if f.required)

_LAYERS = {
    Layer.DEFAULT: SourceLayer.DEFAULT,
    Layer.DISCOVERED: SourceLayer.DISCOVERED,
    Layer.DOTENV: SourceLayer.DOTENV,
    Layer.PROCESS: SourceLayer.PROCESS,
}


@dataclass(frozen=True)
class Resolved:
    """One engine's value of one field. `value` is None only when unset and without a default."""

    value: str | None
    layer: SourceLayer
    variable: str | None
    field: PolicyField

    @property
    def name(self) -> str:
        """The variable to name in messages: the one that set the value, else the fleet-wide one."""
        return self.variable or self.field.variable

    def source(self, observation: str | None = None, detail: str | None = None) -> Source:
        return Source(layer=self.layer, variable=self.variable, observation=observation, detail=detail)


def policy_field(field: str) -> PolicyField:
    """`MAX_NUM_SEQS` or `NARWHAL_MAX_NUM_SEQS` -> its policy field."""
    name = field.removeprefix(PREFIX)
    if name not in FIELD_BY_NAME:
        raise KeyError(f"unknown launch policy field {field!r}")
    return FIELD_BY_NAME[name]


def resolve_engine_field(settings: Settings, n: int, field: str) -> Resolved:
    """Engine `n`'s value of `field`: node override, else fleet-wide variable, else the policy default.

    An empty node override of a required field is an error against that field (it would silently export
    an empty required value), and so is a value over its limit (`core/limits.py`), however the settings
    were built.
    """
    spec = policy_field(field)
    node = settings.lookup(spec.node_variable(n))
    fleet = settings.lookup(spec.variable)
    if node is not None:
        value, layer = node
        if spec.required and not value:
            raise InputError(
                [
                    f"engine-{n}: {spec.node_variable(n)} is set but empty; {spec.variable} is required "
                    f"(remove the override to use {spec.variable}, or give it a value)"
                ]
            )
        source = _LAYERS[layer] if layer in (Layer.DEFAULT, Layer.DISCOVERED) else SourceLayer.NODE_OVERRIDE
        resolved = Resolved(value, source, spec.node_variable(n), spec)
    elif fleet is not None:
        resolved = Resolved(fleet[0], _LAYERS[fleet[1]], spec.variable, spec)
    else:
        return Resolved(spec.default, SourceLayer.DEFAULT, None, spec)
    problem = limits.too_long(resolved.name, resolved.value or "")
    if problem:
        raise InputError([f"engine-{n}: {problem}"])
    return resolved


def required_value(settings: Settings, n: int, field: str) -> Resolved:
    """Like `resolve_engine_field`, but an unset or empty value is an error naming the variable."""
    resolved = resolve_engine_field(settings, n, field)
    if not resolved.value:
        state = "empty" if resolved.value == "" else "unset"
        raise InputError([f"engine-{n}: {resolved.name} is {state}; it is required (set it in .env)"])
    return resolved


def operator_value(settings: Settings, n: int, field: str) -> Resolved | None:
    """Engine `n`'s value of `field` from `.env` or the process environment only (an operator's pin), or None.

    Discovered values are left out on purpose: a pin is checked against what discovery observes now, not
    against what an earlier discovery wrote.
    """
    operator_layers = tuple(
        (layer, values) for layer, values in settings.layers if layer in (Layer.DOTENV, Layer.PROCESS)
    )
    resolved = resolve_engine_field(replace(settings, layers=operator_layers), n, field)
    return None if resolved.layer is SourceLayer.DEFAULT else resolved


def operator_lookup(settings: Settings, name: str) -> tuple[str, str] | None:
    """`name`'s value from `.env` or the process environment, with the variable name, or None: an operator's
    choice, never what an earlier discovery wrote into config/deployment.env."""
    for layer, values in reversed(settings.layers):
        if layer in (Layer.DOTENV, Layer.PROCESS) and name in values:
            return values[name], name
    return None


def looks_like_credential(name: str) -> bool:
    """True for names such as `*_KEY`, `*_TOKEN`, `--hf-token`: those never reach an engine's launch."""
    return CREDENTIAL_RE.search(name) is not None


def parse_int(resolved: Resolved, n: int, low: int, high: int) -> int:
    """An integer in [low, high]; the error names the variable, not the value."""
    text = resolved.value or ""
    if not re.fullmatch(r"[0-9]+", text.strip()) or not low <= int(text) <= high:
        raise InputError([f"engine-{n}: {resolved.name} must be an integer in {low}..{high}"])
    return int(text)


def parse_choice(resolved: Resolved, n: int, choices: tuple[str, ...]) -> str:
    if resolved.value not in choices:
        raise InputError([f"engine-{n}: {resolved.name} must be one of {', '.join(choices)}"])
    return resolved.value


def parse_fraction(resolved: Resolved, n: int) -> float:
    """A float in (0, 1], such as the GPU memory utilisation."""
    try:
        value = float(resolved.value or "")
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise InputError([f"engine-{n}: {resolved.name} must be a number in (0, 1]"])
    return value


PINNED_IMAGE_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._/:-]*@)?sha256:[0-9a-f]{64}")
INTERFACE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")


def parse_image(resolved: Resolved, n: int) -> str:
    """Engine images are pinned so every host runs the bytes discovery inspected."""
    if not PINNED_IMAGE_RE.fullmatch(resolved.value or ""):
        raise InputError(
            [
                f"engine-{n}: {resolved.name} is not pinned; use sha256:<64 hex> or "
                "<name>@sha256:<64 hex> (discovery records the observed id per node)"
            ]
        )
    return resolved.value or ""


def parse_sha256(resolved: Resolved, n: int) -> str:
    if not SHA256_RE.fullmatch(resolved.value or ""):
        raise InputError([f"engine-{n}: {resolved.name} must be 64 lower-case hex digits"])
    return resolved.value or ""


def parse_text(resolved: Resolved, n: int) -> str:
    if not (resolved.value or "").strip() or "\n" in (resolved.value or ""):
        raise InputError([f"engine-{n}: {resolved.name} must be a non-empty single line"])
    return resolved.value or ""


def parse_host_dir(resolved: Resolved, n: int) -> str:
    """An absolute host path usable as a `docker -v SRC:DST:ro` source (no ':' or ',')."""
    value = resolved.value or ""
    if not value.startswith("/") or any(c in value for c in ":,\n"):
        raise InputError([f"engine-{n}: {resolved.name} must be an absolute path without ':' or ','"])
    return value


def parse_interface(resolved: Resolved, n: int) -> str:
    if not INTERFACE_RE.fullmatch(resolved.value or ""):
        raise InputError([f"engine-{n}: {resolved.name} must be a network interface name"])
    return resolved.value or ""

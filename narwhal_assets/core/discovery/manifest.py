"""What a discovery run generates in the checkout, and the run's manifest (`runs/discovery/<run>/manifest.json`).

`GENERATED_FILES` is the one list of the files and directories discovery writes: the private-modes check
covers each entry, and `prepare` refuses a revision whose tree holds any of them. The manifest, published
last, marks a run complete and lists every file of its config set with its SHA-256, so the inventory
sensor can tell discovery's own writes from an operator's edit and `prepare` can refuse a set made from
other inputs. `inputs` lets `prepare` name the inputs that changed without the manifest holding any value:
per input name, an HMAC-SHA256 of its value keyed by a random per-run salt. Runs written before
`inputs_sha256` or `inputs` existed still read (they are then None: `prepare` asks for a new discovery
without naming what changed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.jsonfile import load_json_model
from narwhal_assets.core.records import SHA256_RE, Record

MANIFEST_FILE = "manifest.json"

# Each generated asset and the files or directories it writes (keys are the asset names).
GENERATED_FILES: dict[str, Callable[[Settings], list[Path]]] = {
    "host_inventory": lambda s: [s.hosts_path],
    "ssh_known_hosts": lambda s: [s.known_hosts_path],
    "host_observations": lambda s: [s.discovery_dir],
    "checkpoint_digests": lambda s: [s.discovery_dir],
    "deployment_env": lambda s: [s.deployment_env_path],
    "engine_launch_records": lambda s: [s.launch_config_path, s.launch_sources_path],
    "fleet": lambda s: [s.fleet_path],
    "profiling_limits": lambda s: [s.profiling_limits_path],
}

Sha256 = Annotated[str, Field(pattern=SHA256_RE.pattern)]


def generated_paths(settings: Settings) -> list[Path]:
    """Every private file and directory discovery generates in the checkout, each once."""
    return list(dict.fromkeys(path for paths in GENERATED_FILES.values() for path in paths(settings)))


class InputDigests(Record):
    """Each discovery input by name -> HMAC-SHA256 of its value keyed by `salt`.

    The salt is random per run and the name is part of each digest, so no precomputed table applies and equal
    values (across runs or variables) do not show; a guess can still be checked, as against the deployment
    manifest's destination digests. Passwords and the credential's value are no discovery inputs: not here.
    """

    salt: str = Field(pattern=SHA256_RE.pattern)  # 32 random bytes, hex
    digests: dict[str, Sha256]


# The published config set's format. 2: launch records in the serving fleet's reader's shape (string GPU ids,
# one GPU transport, /dev transfer devices, named sources, pinned packages) and the shared source index.
CONFIG_FORMAT = 2


class DiscoveryManifest(Record):
    """`manifest.json` of a complete discovery run; the field order is the on-disk key order."""

    schema_: Literal["narwhal.discovery-manifest"] = Field(default="narwhal.discovery-manifest", alias="schema")
    schema_version: Literal[1] = 1
    # The format of the config set this run published; runs before formats were recorded published format 1.
    config_format: int = 1
    # Path (relative to the checkout when inside it) -> SHA-256 of every file the run published.
    files: dict[str, Sha256]
    # `discovery_inputs_digest` of the inventory and settings the set was derived from.
    inputs_sha256: Sha256 | None = None
    # The same inputs one by one, so `prepare` can name those that changed.
    inputs: InputDigests | None = None

    @classmethod
    def load(cls, run_dir: Path) -> DiscoveryManifest:
        """The manifest of `run_dir`; an unreadable one is an InputError naming the file and field."""
        return load_json_model(run_dir / MANIFEST_FILE, cls)

"""The deployment manifest (`<out>/manifest.json`): what `prepare` pinned and the only thing `install` ships.

It names hosts by inventory id and variable names only; destinations appear as SHA-256 digests so a changed
destination is detected without the manifest ever holding one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from narwhal_assets.core.records import SHA256_RE, Record

MANIFEST_FILE = "manifest.json"
BUNDLE_FILE = "source.bundle"
REMOTE_BASE = "Narwhal-deploy"
DEPLOYMENT_ID_RE = re.compile(r"[0-9a-f]{32}")
REVISION_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
# Paths inside the prepared directory and inside the remote checkout: relative, plain characters, no `.`/`..`.
PATH_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|\.env\.[a-z0-9-]{1,64}")


def check_relative_path(value: str) -> str:
    """A relative POSIX path of plain parts: it can name nothing outside the directory it is joined to."""
    if len(value) > 1024 or not all(PATH_PART_RE.fullmatch(part) for part in value.split("/")):
        raise ValueError("must be a relative path of letters, digits, '.', '_' and '-' (no '.' or '..' parts)")
    return value


class PreparedFile(Record):
    """One prepared file: where it is under `<out>`, where it goes on the host, and its content digest."""

    path: str
    install_to: str | None = None
    sha256: str = Field(pattern=SHA256_RE.pattern)
    size: int = Field(ge=0)
    # The router's effective fleet may be edited by the operator after install; a reinstall keeps the edit.
    keep_if_present: bool = False

    @field_validator("path", "install_to")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        return None if value is None else check_relative_path(value)


class ManifestHost(Record):
    """One physical host of the deployment, as the inventory had it when prepared."""

    id: str
    ssh_env: str
    password_env: str | None = None
    roles: list[str]
    destination_sha256: str = Field(pattern=SHA256_RE.pattern)
    host_key_fingerprints: list[str] = Field(min_length=1)
    files: list[PreparedFile]

    @field_validator("host_key_fingerprints")
    @classmethod
    def _fingerprints(cls, value: list[str]) -> list[str]:
        bad = [f for f in value if not FINGERPRINT_RE.fullmatch(f)]
        if bad:
            raise ValueError("host_key_fingerprints: each must be SHA256:<43 base64 characters>")
        return value


MANIFEST_SCHEMA: Final = "narwhal.deployment-manifest"
# The prepared-run format. 2: launch records in the serving fleet's reader's shape, `sources.json` with value
# digests and the shared engine variables once. A run of another format is refused, never read as this one.
PREPARED_FORMAT: Final = 2


class DeploymentManifest(Record):
    """`manifest.json`, written last by `prepare`; `install` refuses anything it does not pin."""

    schema_: Literal["narwhal.deployment-manifest"] = Field(default=MANIFEST_SCHEMA, alias="schema")
    schema_version: Literal[2] = PREPARED_FORMAT
    revision: str = Field(pattern=REVISION_RE.pattern)
    deployment_id: str = Field(pattern=DEPLOYMENT_ID_RE.pattern)
    remote_dir: str
    created_at: str
    bundle: PreparedFile
    # `<out>/sources.json`: where every role-file value came from; stays on the workstation (no install_to).
    sources: PreparedFile | None = None
    hosts: list[ManifestHost]

    @model_validator(mode="after")
    def _remote_dir(self) -> DeploymentManifest:
        if self.remote_dir != remote_dir_for(self.deployment_id):
            raise ValueError(f"remote_dir must be {REMOTE_BASE}/<deployment_id>")
        return self

    def host(self, host_id: str) -> ManifestHost:
        for host in self.hosts:
            if host.id == host_id:
                return host
        raise KeyError(host_id)


def remote_dir_for(deployment_id: str) -> str:
    """`Narwhal-deploy/<id>`, relative to the remote user's home."""
    return f"{REMOTE_BASE}/{deployment_id}"


LOGS_DIR = "logs"


@dataclass(frozen=True)
class PreparedRun:
    """A prepared directory and its manifest: the one type for a prepared run, wherever it was found (the
    install path verifies it against the checkout first; `status` and `prune` list the workstation's)."""

    run_dir: Path
    manifest: DeploymentManifest

    def log_path(self, host_id: str) -> Path:
        """`<run>/logs/<host-id>.log`, where install writes what it did on that host."""
        return self.run_dir / LOGS_DIR / f"{host_id}.log"

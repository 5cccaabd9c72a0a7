"""Workstation side of the host installer (`narwhal_assets/host/installer.py`): its input stream and report.

The stream is `<length>\\n<installer source + main('<json>')>` then the raw bytes of each sent file, so
parameters never pass through a shell and file bytes need no encoding. The report is one JSON line,
read from a host that is not trusted: bounded in size, parsed once (linear time), validated field by field.
"""

from __future__ import annotations

import json
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import ReportError
from narwhal_assets.core.prepared_run.manifest import DEPLOYMENT_ID_RE
from narwhal_assets.host import program_call, program_source
from narwhal_assets.protocols.lease import LeaseState, lease_source

INSTALLER = "installer.py"  # the host program's name, as the transport's messages and the host log show it
REPORT_LIMIT = 8 << 20
Action = Literal["inspect", "install", "activate", "status", "prune"]
ENTRY_LIMIT = 256  # the installer's `ENTRY_LIMIT`: entries `status` lists, ids `prune` takes
DeploymentId = Annotated[str, Field(pattern=DEPLOYMENT_ID_RE.pattern, max_length=32)]
MESSAGE_LIMIT = 4096


class Gate(StrEnum):
    """Every gate a host can stop at: the installer's (`narwhal_assets/host/installer.py`) and the
    workstation's own (`connection`, `absent`, `prepared file`, `report`). One spelling, checked on both
    sides: a report naming another gate is not an installer report."""

    CONNECTION = "connection"  # unreachable, authentication, changed host key, command timeout
    DIRECTORY = "directory"  # `Narwhal-deploy` or the deployment directory is a symlink or not a directory
    LOCK = "lock"
    LEASE = "lease"  # the operation's lease on this host is missing, held by another, or was taken over
    TRANSFER = "transfer"
    VERIFY_FILE = "verify file"
    MARKER = "marker"
    CHECKOUT = "checkout"
    PLACE_FILE = "place file"
    VENV = "venv"
    INSTALL = "install"
    CHECK = "check"
    CURRENT = "current"
    ABSENT = "absent"
    PREPARED_FILE = "prepared file"
    REPORT = "report"
    INTERRUPTED = "interrupted"
    IO = "io"


class InstallFile(BaseModel):
    """One file as the installer sees it: its name in the remote directory and where it is placed."""

    name: str
    sha256: str
    size: int
    install_to: str | None = None
    keep_if_present: bool = False


class InstallStep(BaseModel):
    model_config = ConfigDict(extra="ignore")

    argv: list[str] = Field(max_length=64)
    rc: int
    output: str = Field(max_length=256 * 1024)
    seconds: float = 0.0


class DeploymentEntry(BaseModel):
    """One entry of the host's `~/Narwhal-deploy/` as `status` saw it (`foreign`: not a deployment, not read)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=64)
    state: Literal["installed", "incomplete", "locked", "foreign"]
    revision: str | None = Field(default=None, max_length=64)
    file_set: str | None = Field(default=None, max_length=64)
    installed_at: float | None = None
    check: Literal["intact", "tampered", "unknown"] = "unknown"
    problem: str | None = Field(default=None, max_length=4096)

    @field_validator("name", "revision", "file_set", "problem")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return None if value is None else terminal_safe(value)


class InstallReport(BaseModel):
    """The installer's one-line JSON report (`status` and `prune` add their fields)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: Literal["narwhal.install-report"] = Field(alias="schema")
    schema_version: Literal[1]
    action: Action
    outcome: Literal["absent", "incomplete", "reused", "staged", "activated", "listed", "pruned", "failed"]
    gate: str | None = Field(default=None, max_length=32)
    message: str | None = Field(default=None, max_length=MESSAGE_LIMIT)
    files: dict[str, Literal["present", "missing"]] = Field(default_factory=dict)
    files_verified: int = Field(default=0, ge=0)
    files_received: int = Field(default=0, ge=0)
    bytes_received: int = Field(default=0, ge=0)
    steps: list[InstallStep] = Field(default_factory=list, max_length=64)
    seconds: float = 0.0
    current: str | None = Field(default=None, max_length=64)
    deployments: list[DeploymentEntry] = Field(default_factory=list, max_length=ENTRY_LIMIT)
    truncated: bool = False
    leftovers_removed: int = Field(default=0, ge=0)
    removed: list[DeploymentId] = Field(default_factory=list, max_length=ENTRY_LIMIT)
    kept: dict[DeploymentId, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict,
                                                                            max_length=ENTRY_LIMIT)  # fmt: skip
    # What the installer did besides its action (a stale lock taken over, killed installers' leftovers removed)
    notes: list[Annotated[str, Field(max_length=600)]] = Field(default_factory=list, max_length=ENTRY_LIMIT)
    lease: LeaseState | None = None  # the operation's lease on this host after the action, when one was given

    @field_validator("current", "message")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        """Host text reaches the operator's terminal: control and other unprintable characters are escaped."""
        return None if value is None else terminal_safe(value)

    @field_validator("notes")
    @classmethod
    def _printable_notes(cls, value: list[str]) -> list[str]:
        return [terminal_safe(note) for note in value]

    @field_validator("gate")
    @classmethod
    def _known_gate(cls, value: str | None) -> str | None:
        """One of `Gate` (as its plain string, which is what the workstation prints and compares)."""
        return None if value is None else Gate(value).value

    @field_validator("kept")
    @classmethod
    def _printable_reasons(cls, value: dict[str, str]) -> dict[str, str]:
        return {name: terminal_safe(reason) for name, reason in value.items()}


def terminal_safe(text: str) -> str:
    """Host text for the operator's terminal: `core.display.printable`, bounded as a report message is."""
    return printable(text, MESSAGE_LIMIT)


@cache
def installer_source(leased: bool = True) -> str:
    """The installer's program: its source, then (`leased`) the lease's, each exactly as shipped. The installer
    uses the lease's classes only for an action given the operation's lease, and a host has no package to
    import them from (the installer's `from __future__` import must stay first)."""
    installer = program_source(INSTALLER)
    return f"{installer.rstrip()}\n\n\n{lease_source()}" if leased else installer


def installer_program(params: dict[str, Any]) -> str:
    """The program a host runs for `params`: with the lease's source only when they carry a lease. A `status`
    sends 17 KB less per host and costs the host about 5 ms less of compile."""
    return installer_source(leased="lease" in params)


def installer_script(params: dict[str, Any]) -> str:
    """The installer program plus `main('<json>')`: parameters travel as an ASCII JSON string literal."""
    return program_call(installer_program(params), "main", params)


def parse_install_report(stdout: bytes) -> InstallReport:
    """The last non-empty stdout line as a report; anything else is a `ReportError` (no host text quoted)."""
    if len(stdout) > REPORT_LIMIT:
        raise ReportError(f"installer output exceeds {REPORT_LIMIT} bytes")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ReportError("the installer printed no report")
    try:
        return InstallReport.model_validate(json.loads(lines[-1]))
    except (ValueError, ValidationError) as exc:
        kind = "not JSON" if isinstance(exc, json.JSONDecodeError) else "not an install report"
        raise ReportError(f"the installer's last line is {kind}") from None

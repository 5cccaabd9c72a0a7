"""Workstation side of the fleet deploy lock (`narwhal_assets/host/fleet_lock.py`): its script and report.

The program travels like the installer (the same bootstrap: a length-prefixed script on stdin). Its report
comes from a host that is not trusted: bounded, parsed once, every field validated, text made printable.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import NarwhalError
from narwhal_assets.host import program_source

REPORT_LIMIT = 64 * 1024
LockAction = Literal["acquire", "refresh", "release", "show"]


class LockHolder(BaseModel):
    """Who holds the fleet lock, as its owner record says (every field host text: made printable)."""

    model_config = ConfigDict(extra="ignore")

    user: str = Field(default="?", max_length=256)
    workstation: str = Field(default="?", max_length=256)
    command: str = Field(default="?", max_length=64)
    revision: str = Field(default="", max_length=64)
    deployment_id: str = Field(default="", max_length=64)
    message: str = Field(default="", max_length=1024)
    since: str = Field(default="?", max_length=64)
    refreshed: float = 0.0
    # which process on which workstation (and boot): a later deploy there can tell it was killed
    boot: str = Field(default="", max_length=64)
    pid: int = 0
    pid_start: str = Field(default="", max_length=32)

    @field_validator("user", "workstation", "command", "revision", "deployment_id", "message", "since")
    @classmethod
    def _printable(cls, value: str) -> str:
        return printable(value, 256)

    def describe(self, now: float | None = None) -> str:
        """`user@workstation (install of <revision> as <id>, since <time>, refreshed N s ago): "<message>"`."""
        what = f"{self.command}" + (f" of {self.revision[:12]}" if self.revision else "")
        what += f" as {self.deployment_id}" if self.deployment_id else ""
        age = f", refreshed {max(0.0, now - self.refreshed):.0f} s ago" if now and self.refreshed else ""
        said = f': "{self.message}"' if self.message else ""
        return f"{self.user}@{self.workstation} ({what}, since {self.since}{age}){said}"


class LockReport(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: Literal["narwhal.fleet-lock-report"] = Field(alias="schema")
    schema_version: Literal[1]
    action: LockAction
    outcome: Literal["acquired", "refreshed", "released", "shown", "failed"]
    message: str | None = Field(default=None, max_length=4096)
    holder: LockHolder | None = None
    stale: bool = False
    broken: LockHolder | None = None
    now: float = 0.0

    @field_validator("message")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return None if value is None else printable(value, 512)


class LockReportError(NarwhalError):
    """The lock host's answer was not a lock report."""


def lock_script(params: dict[str, Any]) -> str:
    """The lock program plus `main('<json>')`, its parameters an ASCII JSON string literal."""
    literal = json.dumps(params, sort_keys=True, ensure_ascii=True)
    return f"{program_source('fleet_lock.py').rstrip()}\n\n\nmain({literal!r})\n"


def parse_lock_report(stdout: bytes) -> LockReport:
    if len(stdout) > REPORT_LIMIT:
        raise LockReportError(f"the lock program's output exceeds {REPORT_LIMIT} bytes")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise LockReportError("the lock program printed no report")
    try:
        return LockReport.model_validate(json.loads(lines[-1]))
    except (ValueError, ValidationError):
        raise LockReportError("the lock program's last line is not a lock report") from None

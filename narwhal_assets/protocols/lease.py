"""Workstation side of the per-host deploy lease (`narwhal_assets/host/lease.py`): its script and report.

The lease program travels like the installer (the same bootstrap: a length-prefixed script on stdin), alone
for lease-only actions and within the installer's program for every installer call. What a host reports of
its lease is host text: bounded, parsed once, every field validated and made printable.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import LeaseReportError
from narwhal_assets.host import program_call, program_source

LEASE_PROGRAM = "lease.py"  # the host program's name, as the transport's messages show it
REPORT_LIMIT = 64 * 1024
LeaseAction = Literal["acquire", "renew", "release", "release_dead", "clear", "show"]
LeaseStateName = Literal["absent", "ours", "held", "expired", "broken", "lost"]


class LeaseHolder(BaseModel):
    """Who holds a host's lease, as its record says (every text field host text: made printable)."""

    model_config = ConfigDict(extra="ignore")

    user: str = Field(default="?", max_length=1024)
    workstation: str = Field(default="?", max_length=1024)
    command: str = Field(default="?", max_length=1024)
    revision: str = Field(default="", max_length=1024)
    deployment_id: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=1024)
    since: str = Field(default="?", max_length=1024)
    expires: float = 0.0
    # which process on which workstation (and boot): a later command there can tell it was killed
    boot: str = Field(default="", max_length=1024)
    pid: int = 0
    pid_start: str = Field(default="", max_length=1024)
    operation: str = Field(default="", max_length=1024)  # which operation of that process (not its token)

    @field_validator("user", "workstation", "command", "revision", "deployment_id", "message", "since", "boot",
                     "pid_start", "operation", mode="before")  # fmt: skip
    @classmethod
    def _printable(cls, value: object) -> str:
        return printable(str(value if value is not None else ""), 600)

    def describe(self, now: float | None = None) -> str:
        """`user@workstation (install of <revision> as <id>, since <time>, expires in N s): "<message>"`."""
        what = f"{self.command}" + (f" of {self.revision[:12]}" if self.revision else "")
        what += f" as {self.deployment_id}" if self.deployment_id else ""
        if now and self.expires:
            left = self.expires - now
            when = f"expires in {left:.0f} s" if left > 0 else f"expired {-left:.0f} s ago"
            what += f", since {self.since}, {when}"
        else:
            what += f", since {self.since}"
        said = f': "{self.message}"' if self.message else ""
        return f"{self.user}@{self.workstation} ({what}){said}"


class LeaseState(BaseModel):
    """What a host said of its lease after an action (`HostLease.detail` in `host/lease.py`)."""

    model_config = ConfigDict(extra="ignore")

    state: LeaseStateName = "absent"
    holder: LeaseHolder | None = None
    expires_in: float | None = None
    problem: str | None = Field(default=None, max_length=4096)
    leftovers: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=64)
    broken: LeaseHolder | None = None  # an expired (or proven dead) holder this action took over from
    released: bool = False
    cleared: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=64)
    old_fleet_lock: bool = False

    @field_validator("problem")
    @classmethod
    def _printable_problem(cls, value: str | None) -> str | None:
        return None if value is None else printable(value, 512)

    @field_validator("leftovers", "cleared")
    @classmethod
    def _printable_names(cls, value: list[str]) -> list[str]:
        return [printable(name, 128) for name in value]

    def explain(self, now: float) -> str:
        """One line: what is at the lease's place on this host."""
        if self.state == "broken":
            return f"stuck: {self.problem} (deploys refuse it; deploy-hosts lease --release --force clears it)"
        extra = f"; half-written leftovers {', '.join(self.leftovers)} (removed by the next taker)" \
            if self.leftovers else ""  # fmt: skip
        if self.holder is None:
            return "free" + extra
        word = "expired: the next operation takes it over" if self.state == "expired" else "held"
        return f"{word}: {self.holder.describe(now)}{extra}"


class LeaseReport(LeaseState):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: Literal["narwhal.lease-report"] = Field(alias="schema")
    schema_version: Literal[1]
    action: LeaseAction
    outcome: Literal["acquired", "renewed", "released", "not held", "cleared", "shown", "failed"]
    message: str | None = Field(default=None, max_length=4096)
    now: float = 0.0

    @field_validator("message")
    @classmethod
    def _printable_message(cls, value: str | None) -> str | None:
        return None if value is None else printable(value, 512)


def lease_source() -> str:
    """The lease program's source, exactly as shipped (the installer's program starts with it)."""
    return program_source(LEASE_PROGRAM)


def lease_script(params: dict[str, Any]) -> str:
    """The lease program plus `lease_main('<json>')`, its parameters an ASCII JSON string literal."""
    return program_call(lease_source(), "lease_main", params)


def parse_lease_report(stdout: bytes) -> LeaseReport:
    if len(stdout) > REPORT_LIMIT:
        raise LeaseReportError(f"the lease program's output exceeds {REPORT_LIMIT} bytes")
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise LeaseReportError("the lease program printed no report")
    try:
        return LeaseReport.model_validate(json.loads(lines[-1]))
    except (ValueError, ValidationError):
        raise LeaseReportError("the lease program's last line is not a lease report") from None

"""`<run>/logs/<host-id>.log`: what ran on each host, with its exit status and output; programs stored once.

Every installer call sends the same program (the installer's and the lease's sources, about 76 KB) with
per-host parameters, so the program is stored once per prepared run, content-addressed, as
`<run>/logs/programs/<sha256>.py`, and each call's log entry names it beside the parameters (the lease token
left out: it is the operation's alone), the exit status and the host's output. The output is bounded per
stream (LOG_OUTPUT_LIMIT) and a cut says how much was not logged. A reuse adds one entry of about 2 KB per
host; a first install adds the host's own command output. Files 0600 in 0700 directories; nothing in them
is a password or a destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal_assets.local.privatefiles import FILE_MODE, ensure_private_dir, write_private
from narwhal_assets.protocols.install import INSTALLER, InstallReport

LOG_OUTPUT_LIMIT = 256 * 1024
PROGRAMS_DIR = "programs"


_STORING = threading.Lock()  # hosts log from many threads; a program is stored by one of them


def program_path(logs: Path, program: str) -> Path:
    """Where `program` is stored under `logs` (written once: the name is the content's digest)."""
    digest = hashlib.sha256(program.encode("utf-8")).hexdigest()
    path = logs / PROGRAMS_DIR / f"{digest}.py"
    with _STORING:
        if not path.exists():
            ensure_private_dir(path.parent)
            write_private(path, program)
    return path


@dataclass(frozen=True)
class HostLog:
    """`<run>/logs/<host-id>.log`: appended, 0600, never holding a password, destination or lease token."""

    path: Path

    @classmethod
    def open(cls, path: Path) -> HostLog:
        """The log at `path`, its directory made (or tightened to) 0700 once here, not on every write."""
        ensure_private_dir(path.parent)
        return cls(path)

    def call(self, action: str, program: str, params: dict[str, Any]) -> None:
        """One program run: which stored program, with which parameters (token left out)."""
        stored = program_path(self.path.parent, program).relative_to(self.path.parent)
        shown = {k: v for k, v in params.items() if k != "lease"}
        if isinstance(params.get("lease"), dict):
            shown["lease"] = {k: v for k, v in params["lease"].items() if k in ("mode", "release", "lease_s")}
        text = json.dumps(shown, sort_keys=True, ensure_ascii=True)
        ran = f"$ host program {INSTALLER}, under the guard"
        self._append(f"\n=== {_now()} {action}\n{ran}\n--- program {stored} with {text}\n")

    def result(self, rc: int, stdout: bytes, stderr: bytes, report: InstallReport | None) -> None:
        """The exit status and output, then what the report (if one was read) says the host ran: one write.
        A report read is logged as its outcome, not its JSON line again (its steps follow one by one)."""
        said = _clip(stdout) if report is None else f"(an install report: outcome {report.outcome})\n"
        parts = [f"--- exit status {rc} ---\n--- stdout ---\n{said}--- stderr ---\n{_clip(stderr)}"]
        if report is not None:
            parts += [_ended(f"--- host ran: {' '.join(step.argv)}\n--- exit status {step.rc} ({step.seconds:.2f} s) "
                             f"---\n{step.output}") for step in report.steps]  # fmt: skip
            parts += [f"--- note: {note}\n" for note in report.notes]
            if report.outcome == "failed":
                parts.append(f"--- gate {report.gate}: {report.message}\n")
        self._append("".join(parts))

    def note(self, text: str) -> None:
        self._append(f"# {_now()} {text}\n")

    def _append(self, text: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.write(fd, _ended(text).encode("utf-8", "replace"))
        finally:
            os.close(fd)


def _ended(text: str) -> str:
    """`text` ending in a newline."""
    return text if text.endswith("\n") else text + "\n"


def _clip(data: bytes) -> str:
    text = data[:LOG_OUTPUT_LIMIT].decode("utf-8", "replace")
    if len(data) > LOG_OUTPUT_LIMIT:
        text += f"\n[... {len(data) - LOG_OUTPUT_LIMIT} bytes not logged]\n"
    return _ended(text) if text else text


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

"""A process as /proc shows it: the fields of its `stat` and whether it still runs (a zombie does not)."""

from __future__ import annotations

from pathlib import Path


def proc_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the `(comm)`: [0] the state, [1] the parent, [19] the start time; None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    fields = proc_fields(pid)
    return fields is not None and fields[0] != "Z"

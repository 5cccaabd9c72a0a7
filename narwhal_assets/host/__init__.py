"""Programs that run on fleet hosts: standard library only, sent on stdin or copied as files.

Nothing here imports the rest of the package: each module must run alone under `python3 -I -S` on a host
with Python 3.8 or newer. The workstation reads their source through `program_source`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

# How a program sent on stdin runs: isolated, no site import (nothing of the account's environment, faster start).
STDIN_PROGRAM = "python3 -I -S -"


@cache
def program_source(name: str) -> str:
    """The source text of host program `name` (`probe.py`, `guard.py`, ...), exactly as shipped."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")

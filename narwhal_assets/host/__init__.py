"""Programs that run on fleet hosts: standard library only, sent on stdin or copied as files.

Nothing here imports the rest of the package: each module must run alone under `python3 -I -S` on a host
with Python 3.8 or newer. The workstation reads their source through `program_source`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

# How a program sent on stdin runs: isolated, no site import (nothing of the account's environment, faster start).
STDIN_PROGRAM = "python3 -I -S -"


@cache
def program_source(name: str) -> str:
    """The source text of host program `name` (`probe.py`, `guard.py`, ...), exactly as shipped."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def program_call(source: str, entry: str, params: Mapping[str, Any]) -> str:
    """`source` plus a last line `entry('<json>')`: what a host runs under `STDIN_PROGRAM`. Parameters travel
    as an ASCII JSON text inside a Python string literal, so no value is ever read by a shell or by Python as
    code."""
    literal = json.dumps(params, sort_keys=True, ensure_ascii=True)
    return f"{source.rstrip()}\n\n\n{entry}({literal!r})\n"

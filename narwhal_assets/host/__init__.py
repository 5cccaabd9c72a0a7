"""Programs that run on fleet hosts: standard library only, sent on stdin or copied as files.

Nothing here imports the rest of the package: each module must run alone under `python3 -I -S` on a host
with Python 3.8 or newer. The workstation reads their source through `program_source`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any


@cache
def program_source(name: str) -> str:
    """The source text of host program `name` (`probe.py`, `guard.py`, ...), exactly as shipped."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def program_call(source: str, entry: str, params: Mapping[str, Any]) -> str:
    """`source` plus a last line `entry('<json>')`: the script a host runs (`program_stream`). Parameters travel
    as an ASCII JSON text inside a Python string literal, so no value is ever read by a shell or by Python as
    code."""
    literal = json.dumps(params, sort_keys=True, ensure_ascii=True)
    return f"{source.rstrip()}\n\n\n{entry}({literal!r})\n"


def program_stream(script: str, payloads: Sequence[bytes] = ()) -> bytes:
    """What a host program's stdin carries: `<length>\\n`, the ASCII script, then the program's own input (each
    payload's raw bytes, in order). The transport's guard (`guard.py`, `-`) reads the script and runs it in its
    own interpreter, isolated (`-I`: the account's `json.py` cannot shadow the standard library's), no `site`."""
    code = script.encode("ascii")
    return b"".join([str(len(code)).encode() + b"\n", code, *payloads])

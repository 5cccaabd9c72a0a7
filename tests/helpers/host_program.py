"""A host program run locally exactly as the transport runs it over SSH: the guard with `-`, the framed script
(`narwhal_assets.host.program_stream`) and its input on stdin."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from typing import Any

from narwhal_assets.ssh.transport import guard_argv


def run_host_program(
    stream: bytes, env: Mapping[str, str], timeout: float, **options: Any
) -> subprocess.CompletedProcess[bytes]:
    """The guard's whole run (its backstop `timeout`, ours a little later), output captured, never raising on
    the exit status."""
    return subprocess.run(guard_argv(timeout, None), input=stream, capture_output=True, env=dict(env),
                          timeout=timeout + 10, check=False, **options)  # fmt: skip

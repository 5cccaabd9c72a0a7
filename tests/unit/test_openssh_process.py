"""The tunnel's OpenSSH runs as a child (`run_openssh`): signals reach it, its exit status is the tunnel's, and
nothing it started outlives it, not even a ProxyJump hop that ignores SIGHUP."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from helpers.procfs import alive

RUN_OPENSSH = ("import sys\n"
               "from narwhal_assets.ssh.openssh_process import run_openssh\n"
               "from narwhal_assets.ssh.openssh import OpenSshCommand\n"
               "sys.exit(run_openssh(OpenSshCommand(['sh', '-c', sys.argv[1]])))\n")  # fmt: skip


def tunnel_process(script: str) -> subprocess.Popen[str]:
    """`run_openssh` in its own process (it makes that process a subreaper) with `script` standing in for ssh."""
    return subprocess.Popen([sys.executable, "-c", RUN_OPENSSH, script], stdout=subprocess.PIPE, text=True)


def test_what_ssh_leaves_behind_ends_with_it_even_when_it_ignores_sighup(tmp_path: Path) -> None:
    """A ProxyCommand/ProxyJump hop that ignores SIGHUP would outlive ssh (and hold the terminal's pipes)."""
    left = tmp_path / "left.pid"
    script = f"trap '' HUP; (trap '' HUP; exec sleep 300) </dev/null >/dev/null 2>&1 & echo $! > {left}; exit 3"
    assert tunnel_process(script).wait(timeout=30) == 3  # ssh's own exit status
    assert not alive(int(left.read_text()))


def test_sigterm_reaches_ssh_and_its_status_is_the_tunnels() -> None:
    process = tunnel_process("trap 'exit 7' TERM; echo ready; while :; do sleep 0.1; done")
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 7

"""The system OpenSSH client aimed at a simulated fleet, for tests and demos.

It trusts host keys only through its own known_hosts file with `accept-new`, the policy discovery
uses, so a test sees exactly what a first connection and a changed key look like.

Each ssh runs in a session of its own with its output in files, and its result is ready when ssh itself has
exited: then what it started and left running (a ProxyJump hop, which ssh ends only by a SIGHUP that can be
lost or ignored) is killed with the session. Pipes would wait for that hop too, up to the minutes its TCP
connect can take behind a cut link.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FleetSsh:
    """`ssh -F <config>` with a private known_hosts.

    `config` includes the fleet's ssh config and repeats the known-hosts options: for a ProxyJump hop,
    ssh passes on `-F` but none of the `-o` options, so the bastion hop reads them from the file.
    """

    config: Path
    known_hosts: Path

    @classmethod
    def create(cls, fleet_ssh_config: Path, directory: Path, name: str = "fleet") -> FleetSsh:
        """Write an empty known_hosts and the wrapping config into `directory`."""
        known_hosts = directory / f"known_hosts.{name}"
        known_hosts.touch(mode=0o600)
        config = directory / f"ssh_config.{name}"
        config.write_text(
            f"Include {fleet_ssh_config}\n"
            "Host *\n"
            f"    UserKnownHostsFile {known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking accept-new\n"
            "    BatchMode yes\n",
            encoding="utf-8",
        )
        return cls(config, known_hosts)

    def argv(self, host: str, *options: str) -> list[str]:
        """`options` come first: for ssh the first value given for an option wins."""
        return [
            "ssh", "-F", str(self.config), *options,
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=accept-new",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            host,
        ]  # fmt: skip

    def run(self, host: str, command: str, *options: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return run_session([*self.argv(host, *options), command], timeout)

    def run_password(self, host: str, command: str, password: str, *options: str) -> subprocess.CompletedProcess[str]:
        """Password login through `sshpass -d FD`: the secret travels in a pipe, never argv or environ."""
        read_fd, write_fd = os.pipe()
        os.write(write_fd, password.encode() + b"\n")
        os.close(write_fd)
        auth = ("-o", "BatchMode=no", "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password",
                "-o", "NumberOfPasswordPrompts=1")  # fmt: skip
        try:
            return run_session(["sshpass", f"-d{read_fd}", *self.argv(host, *auth, *options), command], 30,
                               pass_fds=(read_fd,))  # fmt: skip
        finally:
            os.close(read_fd)

    def run_all(self, commands: Sequence[tuple[str, str]]) -> list[subprocess.CompletedProcess[str]]:
        """Run (host, command) pairs concurrently; results in the same order."""
        sessions = [Session([*self.argv(h), c]) for h, c in commands]
        return [session.result(60) for session in sessions]


class Session:
    """One command in a session (and process group) of its own, stdout and stderr in files."""

    def __init__(self, argv: list[str], pass_fds: Sequence[int] = ()) -> None:
        self.argv = argv
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed in result)
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
                                        pass_fds=tuple(pass_fds), start_new_session=True)  # fmt: skip

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Wait until the command itself exits (not what it left running), kill its group, return its output;
        `subprocess.TimeoutExpired` if it runs past `timeout` seconds (the group is killed then too)."""
        pid, deadline = self.process.pid, time.monotonic() + timeout
        try:
            # WNOWAIT: the exited command stays a zombie, so its pid (the group's id) cannot be reused before
            # the group is killed.
            while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self.argv, timeout)
                time.sleep(0.02)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            returncode = self.process.wait()
            texts = []
            for file in (self.out, self.err):
                file.seek(0)
                texts.append(file.read().decode(errors="replace"))
                file.close()
        return subprocess.CompletedProcess(self.argv, returncode, texts[0], texts[1])


def run_session(argv: list[str], timeout: float, pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`, but done when argv's process
    exits, whatever it left running (which is killed)."""
    return Session(argv, pass_fds).result(timeout)

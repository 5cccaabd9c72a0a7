"""The system OpenSSH client aimed at a simulated fleet, for tests and demos.

It trusts host keys only through its own known_hosts file with `accept-new`, the policy discovery
uses, so a test sees exactly what a first connection and a changed key look like.
"""

from __future__ import annotations

import os
import subprocess
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
        return subprocess.run(
            [*self.argv(host, *options), command], capture_output=True, text=True, timeout=timeout, check=False
        )

    def run_password(self, host: str, command: str, password: str, *options: str) -> subprocess.CompletedProcess[str]:
        """Password login through `sshpass -d FD`: the secret travels in a pipe, never argv or environ."""
        read_fd, write_fd = os.pipe()
        os.write(write_fd, password.encode() + b"\n")
        os.close(write_fd)
        auth = ("-o", "BatchMode=no", "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password",
                "-o", "NumberOfPasswordPrompts=1")  # fmt: skip
        try:
            return subprocess.run(
                ["sshpass", f"-d{read_fd}", *self.argv(host, *auth, *options), command],
                capture_output=True, text=True, timeout=30, check=False, pass_fds=(read_fd,),
            )  # fmt: skip
        finally:
            os.close(read_fd)

    def run_all(self, commands: Sequence[tuple[str, str]]) -> list[subprocess.CompletedProcess[str]]:
        """Run (host, command) pairs concurrently; results in the same order."""
        procs = [
            subprocess.Popen([*self.argv(h), c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for h, c in commands
        ]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return results

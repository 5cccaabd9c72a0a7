"""Interactive sessions (`shell`, `tunnel`) exec OpenSSH with strict checking against the checkout store.

ProxyJump hops are spelled out as nested ProxyCommands, because OpenSSH does not pass command-line
options to jump hosts: every hop is then checked against the same store, never ~/.ssh/known_hosts.
A password reaches `sshpass -d FD` through a pipe, never argv or the environment. It is written into the
pipe before exec, so its size is bounded below one page (the smallest pipe capacity): the write can
never block, whatever the size, and a longer value is refused (OpenSSH itself reads at most 1023 bytes).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.limits import maximum
from narwhal_assets.ssh.destination import Endpoint

SSH = "ssh"
SSHPASS = "sshpass"
MAX_PASSWORD_BYTES = maximum("NARWHAL_ROUTER_SSH_PASSWORD")  # every password variable has this limit


def trust_options(known_hosts: Path) -> list[str]:
    return [
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", "CheckHostIP=no",
    ]  # fmt: skip


def _hop_argv(endpoint: Endpoint, known_hosts: Path, ssh_config: Path | None) -> list[str]:
    """`ssh` options that reach `endpoint` exactly as the paramiko transport does."""
    argv = ["-F", str(ssh_config) if ssh_config else "/dev/null", *trust_options(known_hosts)]
    argv += ["-p", str(endpoint.port), "-l", endpoint.user, "-o", f"HostName={endpoint.host}"]
    for identity in endpoint.identity_files:
        argv += ["-i", identity]
    if endpoint.jumps:
        argv += ["-o", "ProxyJump=none", "-o", f"ProxyCommand={_proxy_command(endpoint, known_hosts, ssh_config)}"]
    return argv


def _proxy_command(endpoint: Endpoint, known_hosts: Path, ssh_config: Path | None) -> str:
    jump = endpoint.jumps[-1]
    outer = Endpoint(**{**jump.__dict__, "jumps": endpoint.jumps[:-1] + jump.jumps})
    argv = [SSH, *_hop_argv(outer, known_hosts, ssh_config), "-o", "BatchMode=yes", "-W", "%h:%p", outer.alias]
    return " ".join(a if a == "%h:%p" else shlex.quote(a).replace("%", "%%") for a in argv)


@dataclass
class OpenSshCommand:
    """The argv to exec and, for password hosts, the pipe carrying the password to sshpass."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    password: str | None = field(default=None, repr=False)

    def prepare_password_pipe(self) -> None:
        """Write the password into a fresh pipe whose read end sshpass inherits (`-d FD`)."""
        if self.password is None:
            return
        secret = self.password.encode()
        if len(secret) > MAX_PASSWORD_BYTES or b"\n" in secret:
            raise InputError([f"password: must be one line of at most {MAX_PASSWORD_BYTES} bytes"])
        read_fd, write_fd = os.pipe()
        try:
            os.set_blocking(write_fd, False)  # a full pipe would raise, never hang (cannot happen below a page)
            os.write(write_fd, secret + b"\n")
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_inheritable(read_fd, True)
        self.argv = [SSHPASS, "-d", str(read_fd), *self.argv]
        self.pass_fds = (read_fd,)


def openssh_command(
    endpoint: Endpoint,
    known_hosts: Path,
    ssh_config: Path | None,
    *,
    password: str | None = None,
    remote_command: str | None = None,
    forward: tuple[int, str, int] | None = None,
    tty: bool = True,
) -> OpenSshCommand:
    """Build `ssh -t ... alias [command]` (`-T` without `tty`: exact output for scripts) or, with `forward`,
    `ssh -N -L ...` for a tunnel."""
    argv = [SSH, *_hop_argv(endpoint, known_hosts, ssh_config)]
    if password is not None:
        argv += ["-o", "PreferredAuthentications=password,keyboard-interactive", "-o", "PubkeyAuthentication=no"]
    if forward is not None:
        local, remote_host, remote_port = forward
        shown = f"[{remote_host}]" if ":" in remote_host else remote_host  # OpenSSH's -L brackets an IPv6 host
        argv += ["-N", "-o", "ExitOnForwardFailure=yes", "-L", f"127.0.0.1:{local}:{shown}:{remote_port}"]
    else:
        argv.append("-t" if tty else "-T")
    argv += ["--", endpoint.alias]
    if remote_command is not None:
        argv.append(remote_command)
    return OpenSshCommand(argv, password=password)

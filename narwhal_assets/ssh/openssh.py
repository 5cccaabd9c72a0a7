"""Interactive sessions (`shell`, `tunnel`) exec OpenSSH with strict checking against the checkout store.

OpenSSH gets what the resolution gave it (`-F` with the operator's config, `-l`/`-p` when the destination
named them, and the alias), so it resolves the same answer itself: host name, user, port, keys,
certificates, agent, HostKeyAlias, ProxyCommand, algorithms. The one thing spelled out is a ProxyJump route,
because OpenSSH passes no command-line option to the ssh it starts for a hop: each hop becomes the command
OpenSSH itself would run for it (`ssh [-l user] [-p port] -W '[%h]:%p' hop`, the hops before it nested the
same way) plus the trust options, so every hop is checked against the same store, never ~/.ssh/known_hosts.
A password reaches `sshpass -d FD` through a pipe, never argv or the environment. It is written into the
pipe before exec, so its size is bounded below one page (the smallest pipe capacity): the write can
never block, whatever the size, and a longer value is refused (OpenSSH itself reads at most 1023 bytes).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.limits import maximum
from narwhal_assets.ssh.destination import Endpoint
from narwhal_assets.ssh.resolver import Query, config_args

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


def _argv(endpoint: Endpoint, known_hosts: Path) -> list[str]:
    """`ssh` options that reach `endpoint` exactly as it was resolved (and as the paramiko transport goes)."""
    query = endpoint.query or Query(endpoint.alias, endpoint.user, endpoint.port)
    argv = [*config_args(query.config), *trust_options(known_hosts)]
    for flag, value in (("-l", query.user), ("-p", query.port)):
        if value is not None:
            argv += [flag, str(value)]
    if endpoint.via is not None:
        argv += ["-o", f"ProxyCommand={_hop_command(endpoint.via, known_hosts)}"]
    return argv


def _hop_command(hop: Endpoint, known_hosts: Path) -> str:
    """The command OpenSSH runs for a ProxyJump hop, with the trust options; `%` doubled except in the
    `-W` target, which the ssh running this command expands to the next host's name and port."""
    argv = [SSH, *_argv(hop, known_hosts), "-o", "BatchMode=yes"]
    quoted = [shlex.quote(a).replace("%", "%%") for a in argv]
    return " ".join([*quoted, "-W", "'[%h]:%p'", "--", shlex.quote(hop.alias).replace("%", "%%")])


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
    *,
    password: str | None = None,
    remote_command: str | None = None,
    forwards: Sequence[tuple[int, str, int]] = (),
    tty: bool = True,
) -> OpenSshCommand:
    """Build `ssh -t ... alias [command]` (`-T` without `tty`: exact output for scripts) or, with `forwards`,
    `ssh -N -L ... [-L ...]` for a tunnel."""
    argv = [SSH, *_argv(endpoint, known_hosts)]
    if password is not None:
        argv += ["-o", "PreferredAuthentications=password,keyboard-interactive", "-o", "PubkeyAuthentication=no"]
    if forwards:
        argv += ["-N", "-o", "ExitOnForwardFailure=yes"]
        for local, remote_host, remote_port in forwards:
            shown = f"[{remote_host}]" if ":" in remote_host else remote_host  # OpenSSH's -L brackets IPv6
            argv += ["-L", f"127.0.0.1:{local}:{shown}:{remote_port}"]
    else:
        argv.append("-t" if tty else "-T")
    argv += ["--", endpoint.alias]
    if remote_command is not None:
        argv.append(remote_command)
    return OpenSshCommand(argv, password=password)

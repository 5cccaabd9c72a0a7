"""OpenSSH argv building (`ssh/openssh.py`): strict host-key options for the target and every ProxyJump hop,
and a password handed to sshpass only through a pipe, never in argv or the environment."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import MAX_PASSWORD_BYTES, openssh_command


def test_openssh_command_is_strict_and_spells_out_proxyjump(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host b\n  HostName 10.1.0.1\nHost t\n  HostName 10.1.0.2\n  ProxyJump b\n")
    store = tmp_path / "kh"
    command = openssh_command(resolve_endpoint("u@t", config), store, remote_command="true")
    argv = command.argv
    for option in ("StrictHostKeyChecking=yes", f"UserKnownHostsFile={store}", "GlobalKnownHostsFile=/dev/null"):
        assert option in argv
    assert argv[argv.index("-F") + 1] == str(config) and argv[argv.index("-l") + 1] == "u" and "-p" not in argv
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert "StrictHostKeyChecking=yes" in proxy and f"UserKnownHostsFile={store}" in proxy
    assert proxy.endswith(" -W '[%h]:%p' -- b") and f"-F {config}" in proxy and "-l" not in proxy
    assert argv[-3:] == ["--", "t", "true"]


def test_password_reaches_sshpass_through_a_pipe_only(tmp_path: Path) -> None:
    secret = "pw-SENTINEL-unit"
    command = openssh_command(resolve_endpoint("u@10.0.0.1", None), tmp_path / "kh", password=secret)
    assert secret not in repr(command) and all(secret not in a for a in command.argv)
    command.prepare_password_pipe()
    assert command.argv[:2] == ["sshpass", "-d"] and int(command.argv[2]) == command.pass_fds[0]
    assert os.read(command.pass_fds[0], 100) == secret.encode() + b"\n"
    os.close(command.pass_fds[0])


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_password_handover_rules_at_the_argv_and_fd_layer(tmp_path: Path) -> None:
    """Each rule of the handover to sshpass, checked on what is exec'd (the /proc scan in tests/fleet checks
    the same rules on the running processes): not in argv, not in the environment, only through a pipe."""
    secret = "pw-SENTINEL-unit-" + "x" * (MAX_PASSWORD_BYTES - 17)
    assert len(secret) == MAX_PASSWORD_BYTES
    environ = dict(os.environ)
    command = openssh_command(resolve_endpoint("u@10.0.0.1", None), tmp_path / "kh", password=secret)
    assert secret not in repr(command) and all(secret not in a for a in command.argv)
    command.prepare_password_pipe()
    # argv: sshpass reads the password from an inherited descriptor, no -p (argv), -e (environment), -f (file)
    assert command.argv[:3] == ["sshpass", "-d", str(command.pass_fds[0])]
    assert not {"-p", "-e", "-f"} & set(command.argv[:3]) and all(secret not in a for a in command.argv)
    assert os.environ == environ, "the handover changed the environment the exec'd process inherits"
    # fd: a pipe, inheritable, only that one passed; it holds exactly the password line and then EOF
    [fd] = command.pass_fds
    assert stat.S_ISFIFO(os.fstat(fd).st_mode) and os.get_inheritable(fd)
    assert os.read(fd, 4096) == secret.encode() + b"\n"
    assert os.read(fd, 4096) == b"", "the write end must be closed: nobody else can hold or add to the secret"
    os.close(fd)


@pytest.mark.parametrize("secret", ["p" * (MAX_PASSWORD_BYTES + 1), "p" * 100_000, "two\nlines"])
def test_an_absurd_password_is_refused_before_any_pipe_is_made(tmp_path: Path, secret: str) -> None:
    command = openssh_command(resolve_endpoint("u@10.0.0.1", None), tmp_path / "kh", password=secret)
    before = _open_fds()
    with pytest.raises(InputError) as refused:
        command.prepare_password_pipe()
    assert secret not in str(refused.value) and _open_fds() == before and command.argv[0] == "ssh"

"""`shell` and `tunnel`: the OpenSSH command (strict, checkout store) for the host owning a role.

A role shell enters a deployment's checkout on that host with only that role's environment; a tunnel
forwards ports to it. Both are checked here before OpenSSH starts: the role's host from the inventory, the
prepared run's manifest against the checkout (`--run`), the destination resolved as every other command
resolves it. Running the command is `ssh.openssh_process`'s.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.prepared_run.manifest import REMOTE_BASE
from narwhal_assets.core.roles import Role
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_access
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import OpenSshCommand, openssh_command
from narwhal_assets.workflows.install import open_prepared_run

CURRENT_DIR = f"{REMOTE_BASE}/current"


def role_host_openssh(
    checkout: Checkout,
    role_name: str,
    *,
    run: Path | None = None,
    current: bool = False,
    command: str | None = None,
    forwards: Sequence[tuple[int, str, int]] = (),
) -> OpenSshCommand:
    """OpenSSH to the host owning `role_name`: a login shell; with `run` (a prepared, installed run) or
    `current`, that deployment's role shell, or `command` run in it without a TTY; with `forwards`, a tunnel."""
    entry = checkout.inventory.host_for_role(role_name)
    remote_dir = CURRENT_DIR if current else None
    if run is not None:
        remote_dir = open_prepared_run(checkout.settings, checkout.inventory, run).manifest.remote_dir
    remote_command = None
    if remote_dir is not None:
        role = Role.parse(role_name)
        assert role is not None  # the inventory only holds valid roles
        remote_command = role_shell_command(remote_dir, role, command, entry.id)
    elif command is not None:
        raise InputError(["--command needs --run or --current: it runs in the role environment of a deployment"])
    access = host_access(checkout.settings, entry)
    endpoint = resolve_endpoint(access.destination, checkout.settings.ssh_config_path)
    return openssh_command(
        endpoint,
        checkout.settings.known_hosts_path,
        password=access.password,
        remote_command=remote_command,
        forwards=forwards,
        tty=command is None,
    )


def role_shell_command(remote_dir: str, role: Role, command: str | None, host_id: str) -> str:
    """The remote command of a role shell: enter the deployed checkout, load only this role's file with
    tracing off, activate `.venv`, then an interactive bash (or `command`) without profile or rc files.

    The prompt names the role and host (`(engine-2@node-2) ~/Narwhal-deploy/... (.venv) $`): `activate` alone
    would leave `(.venv) bash-5.2$`, the same on every host of the fleet.

    `remote_dir` is `Narwhal-deploy/<hex id>` (checked by the manifest model) or `Narwhal-deploy/current`
    (the deployment in service), so it needs no quoting.
    """
    final = "-i" if command is None else f"-c {shlex.quote(command)}"
    inner = (
        f'{{ cd "$HOME"/{remote_dir} && test -f installed; }} 2>/dev/null || '
        f'{{ echo "{remote_dir} is not installed here: run deploy-hosts install" >&2; exit 1; }}; '
        "cd checkout || exit 1; "
        f"set +x; . runs/deployment/{role.env_file} || exit 1; . .venv/bin/activate || exit 1; "
        f"PS1={shlex.quote(_prompt(role, host_id))}; export PS1; "
        f"exec bash --noprofile --norc {final}"
    )
    return f"exec bash --noprofile --norc -c {shlex.quote(inner)}"


def _prompt(role: Role, host_id: str) -> str:
    """bash's PS1 for a role shell; role names and host ids are checked identifiers, so nothing here expands."""
    return f"({role.name}@{host_id}) \\w (.venv) \\$ "

"""`shell` and `tunnel`: OpenSSH (strict, checkout store) for the host owning a role.

`shell` execs it (the terminal, signals and exit status are OpenSSH's own). `tunnel` runs it as a child and
stays until it ends: ssh ends a ProxyCommand/ProxyJump hop only by a SIGHUP that is lost when the hop ignores
SIGHUP (inherited from `nohup` or a CI runner) or receives it before it has set its handler, and a hop left
behind keeps the tunnel's stdout and stderr open for minutes. So `tunnel` takes every process ssh leaves behind
as its own (PR_SET_CHILD_SUBREAPER) and ends them when ssh ends; SIGTERM, SIGINT and SIGHUP go on to ssh (one
this process was started with ignored stays ignored, as ssh would keep it).
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.prepared_run.manifest import REMOTE_BASE
from narwhal_assets.core.roles import Role

if TYPE_CHECKING:  # paramiko and the installer load only when a shell or tunnel is opened (fast --help)
    from narwhal_assets.ssh.openssh import OpenSshCommand

CURRENT_DIR = f"{REMOTE_BASE}/current"
FORWARD_RE = re.compile(r"(\d+):(?:(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):)?(\d+)")


def parse_forward(text: str) -> tuple[int, str, int]:
    """`LOCAL:REMOTE` or `LOCAL:HOST:REMOTE`; the remote host defaults to the engine host's loopback."""
    match = FORWARD_RE.fullmatch(text)
    ports = [int(match.group(1)), int(match.group(3))] if match else []
    if not match or not all(1 <= p <= 65535 for p in ports):
        raise InputError(["--forward: expected LOCAL:REMOTE or LOCAL:HOST:REMOTE with ports 1..65535"])
    host = match.group(2) or "127.0.0.1"
    if host.startswith("["):  # an IPv6 address, written in brackets as OpenSSH wants it
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise InputError([f"--forward: {host} is not an IPv6 address in brackets"]) from None
    return ports[0], host, ports[1]


def parse_forwards(texts: list[str]) -> list[tuple[int, str, int]]:
    """Every `--forward`, each local port at most once (OpenSSH would serve only one of them)."""
    forwards = [parse_forward(text) for text in texts]
    locals_ = [local for local, _, _ in forwards]
    repeated = sorted({port for port in locals_ if locals_.count(port) > 1})
    if repeated:
        raise InputError([f"--forward: local port {', '.join(map(str, repeated))} given more than once; "
                          "select a distinct local port for each forward"])  # fmt: skip
    return forwards


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


def build(args: argparse.Namespace) -> OpenSshCommand:
    from narwhal_assets.local.checkout import Checkout
    from narwhal_assets.ssh.access import host_access
    from narwhal_assets.ssh.destination import resolve_endpoint
    from narwhal_assets.ssh.openssh import openssh_command
    from narwhal_assets.workflows.install import open_prepared_run

    forwards = parse_forwards(getattr(args, "forward", None) or [])
    checkout = Checkout.open(args.root)
    entry = checkout.inventory.host_for_role(args.role)
    remote_command, command = None, getattr(args, "run_command", None)  # `args.command` is the subcommand
    remote_dir = CURRENT_DIR if getattr(args, "current", False) else None
    if getattr(args, "run", None) is not None:
        remote_dir = open_prepared_run(checkout.settings, checkout.inventory, args.run).manifest.remote_dir
    if remote_dir is not None:
        role = Role.parse(args.role)
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


def exec_openssh(command: OpenSshCommand) -> NoReturn:
    """Replace this process with OpenSSH, so the terminal, signals and exit status are its own."""
    command.prepare_password_pipe()
    os.execvp(command.argv[0], command.argv)


def shell(args: argparse.Namespace) -> int:
    """Exec OpenSSH: an interactive shell, the role shell of a prepared run, or one command in it."""
    return exec_openssh(build(args))


FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 2.0  # what ssh left behind gets SIGTERM, then SIGKILL after this long


def run_openssh(command: OpenSshCommand) -> int:
    """Run OpenSSH as a child, pass it SIGTERM/SIGINT/SIGHUP, and end whatever it left running when it ends;
    its exit status (128+N when a signal N ended it)."""
    command.prepare_password_pipe()
    _become_subreaper()
    process: subprocess.Popen[bytes] | None = None
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if process is not None and process.returncode is None:
            process.send_signal(signum)

    # One ignored when this process started (`nohup`) stays ignored, for ssh too, as ssh itself does; the others
    # get a Python handler, so ssh starts with them at their default disposition.
    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS
                if signal.getsignal(signum) != signal.SIG_IGN}  # fmt: skip
    try:
        process = subprocess.Popen(command.argv, pass_fds=command.pass_fds)
        for fd in command.pass_fds:
            os.close(fd)  # sshpass has its own copy of the password pipe
        if received:  # a signal that came before ssh existed
            process.send_signal(received[0])
        rc = process.wait()
    finally:
        _end_leftovers()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 128 - rc if rc < 0 else rc


def _become_subreaper() -> None:
    """Orphans of ssh (its ProxyCommand/ProxyJump hops) become this process's children, not init's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _children() -> list[int]:
    """This process's live children (ssh's orphans among them), from /proc/<pid>/task/*/children."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(found)


def _end_leftovers() -> None:
    """SIGTERM to every child still here, SIGKILL to those alive after LEFTOVER_GRACE_S; all reaped."""
    deadline, sent = time.monotonic() + LEFTOVER_GRACE_S, signal.SIGTERM
    while children := _children():
        for pid in children:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    os.kill(pid, sent)
            except (ChildProcessError, ProcessLookupError):
                continue
        if time.monotonic() >= deadline:
            sent = signal.SIGKILL
        time.sleep(0.05)


def tunnel(args: argparse.Namespace) -> int:
    """OpenSSH forwarding ports until a signal (or the connection) ends it, then nothing it started is left."""
    return run_openssh(build(args))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sh = sub.add_parser("shell", help="interactive shell on the host owning --role (with --run or --current: in "
                        "its role environment)")  # fmt: skip
    sh.add_argument("--role", required=True, metavar="ROLE", help="router or engine-<n>: the host owning it")
    which = sh.add_mutually_exclusive_group()
    which.add_argument("--run", type=Path, metavar="DIR", help="a prepared and installed run: enter its checkout, "
                       "load runs/deployment/.env.ROLE (tracing off), activate .venv")  # fmt: skip
    which.add_argument("--current", action="store_true", help=f"the same in the deployment ~/{CURRENT_DIR} "
                       "points at (the one in service), without naming its prepared run")  # fmt: skip
    sh.add_argument("--command", dest="run_command", metavar="CMD", help="with --run or --current: run CMD in "
                    "that environment without a TTY instead of an interactive bash")  # fmt: skip
    sh.set_defaults(func=shell)
    tn = sub.add_parser("tunnel", help="forward local ports to the host owning --role")
    tn.add_argument("--role", default="router", metavar="ROLE",
                    help="router (the default) or engine-<n>: the host owning it")  # fmt: skip
    tn.add_argument("--forward", required=True, action="append", metavar="LOCAL:[HOST:]REMOTE",
                    help="listen on 127.0.0.1:LOCAL, connect to HOST:REMOTE as seen from that host "
                    "(HOST defaults to its loopback); repeat for more ports, each LOCAL once")  # fmt: skip
    tn.set_defaults(func=tunnel)

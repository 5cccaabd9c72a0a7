"""`deploy-hosts preload` (`cli/preload.py`, `cli/preload_server.py`, `cli/resident.py`, `cli/entry.py`), as
real processes: a command forked from the preloaded process answers exactly as one run in its own process,
its caller's signals reach it, a killed caller takes it down, and a changed program or environment, or a
runtime directory others could enter, makes the command run in its own process instead."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.env_checkout import write_checkout
from helpers.polling import wait_for
from helpers.procfs import alive, proc_fields

from narwhal_assets.cli import resident

PROXY_MARK = "307"  # `sleep 307`: the proxied checkout's ProxyCommand, found in /proc by its arguments


@dataclass(frozen=True)
class World:
    env: dict[str, str]
    plain: Path  # its hosts refuse the connection at once (127.0.0.1 port 1)
    proxied: Path  # its ProxyCommand never answers

    def run(self, root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(root, *args), env=env or self.env, capture_output=True, text=True,
                              timeout=180, check=False)  # fmt: skip

    def start(self, root: Path, *args: str, sigint: Any = signal.SIG_DFL) -> subprocess.Popen[str]:
        """The command as an operator's shell starts it: SIGINT by default, even where pytest runs with it
        ignored (a CI runner's `cmd &`), unless `sigint` says otherwise (the caller passes it on)."""
        return subprocess.Popen(self.argv(root, *args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))  # fmt: skip

    def argv(self, root: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "narwhal_assets", "--root", str(root), *args]

    def status(self, env: dict[str, str] | None = None) -> dict[str, int] | None:
        return resident.ask(env or self.env, {"status": True})  # type: ignore[return-value]


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private runtime directory with a short path (a socket's path is at most 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="preload-") as path:
        yield Path(path)


def environment(runtime: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env.update(XDG_RUNTIME_DIR=str(runtime), **extra)
    return env


def preload(env: dict[str, str], action: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "narwhal_assets", "preload", action, "--idle", "10"]
    return subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("preload")
    runtime = Path(tempfile.mkdtemp(prefix="preload-"))
    plain = write_checkout(base / "plain")
    proxied = write_checkout(base / "proxied", "NARWHAL_SSH_CONFIG=ssh_config")
    (proxied / "ssh_config").write_text(f"Host *\n  ProxyCommand sleep {PROXY_MARK}\n", encoding="utf-8")
    env = environment(runtime, DAGSTER_HOME=str(base / "dagster"))
    started = preload(env, "start")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("preloaded process "), started.stdout
    try:
        yield World(env, plain, proxied)
    finally:
        preload(env, "stop")
        shutil.rmtree(runtime, ignore_errors=True)


def served(world: World) -> int:
    answer = world.status()
    assert answer is not None, "the preloaded process is gone"
    return answer["served"]


def proxies() -> list[int]:
    """The pids of the proxied checkout's ProxyCommands now running."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", PROXY_MARK.encode()] and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def commands_of(server_pid: int) -> list[int]:
    """The server's children: the commands it forked and still runs."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_fields(int(entry.name))
            if fields is not None and fields[1] == str(server_pid) and fields[0] != "Z":
                children.append(int(entry.name))
    return children


@pytest.mark.parametrize(
    "args",
    [("plan",), ("check-access", "--timeout", "5"), ("status",), ("plan", "--no-such-option")],
    ids=["plan", "check-access", "status", "usage"],
)
def test_a_preloaded_command_answers_as_the_command_in_its_own_process(world: World, args: tuple[str, ...]) -> None:
    before = served(world)
    preloaded = world.run(world.plain, *args)
    assert served(world) == before + 1  # it was forked from the preloaded process
    in_place = world.run(world.plain, *args, env={**world.env, "PRELOAD_TEST": "another environment"})
    assert served(world) == before + 1  # another environment's command never reaches this process
    assert (preloaded.returncode, preloaded.stdout, preloaded.stderr) == (
        in_place.returncode, in_place.stdout, in_place.stderr)  # fmt: skip
    assert preloaded.stdout or preloaded.stderr


def test_standard_input_reaches_the_command(world: World) -> None:
    """The descriptors are the caller's own: a command reading its input reads what the caller was given."""
    done = subprocess.run(world.argv(world.plain, "plan"), env=world.env, input="", capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("inventory ")


@pytest.mark.parametrize(("signum", "returncode", "stderr"), [
    (signal.SIGINT, 130, "deploy-hosts check-access: interrupted\n"),
    (signal.SIGTERM, -signal.SIGTERM, ""),
])  # fmt: skip
def test_the_callers_signal_reaches_the_command(world: World, signum: int, returncode: int, stderr: str) -> None:
    before = served(world)
    caller = world.start(world.proxied, "check-access", "--timeout", "120")
    try:
        wait_for(lambda: len(proxies()) == 1 and served(world) == before + 1, "the command waiting on its proxy")
        caller.send_signal(signum)
        _out, err = caller.communicate(timeout=60)
    finally:
        caller.kill()
    assert (caller.returncode, err) == (returncode, stderr)
    if signum == signal.SIGINT:  # the command ended its connection, and with it its proxy
        wait_for(lambda: not proxies(), "the ProxyCommand's end")
    else:
        for pid in proxies():  # in its own session, as a command run in place leaves it: end it here
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: world.status() is not None and world.status()["running"] == 0, "the command's end")


def test_a_signal_the_caller_ignores_is_ignored_by_the_command(world: World) -> None:
    """`cmd &` in a script starts it with SIGINT ignored: the forked command ignores it too, as it would in place."""
    before = served(world)
    caller = world.start(world.proxied, "check-access", "--timeout", "120", sigint=signal.SIG_IGN)
    try:
        wait_for(lambda: len(proxies()) == 1 and served(world) == before + 1, "the command waiting on its proxy")
        caller.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            caller.wait(timeout=2)
        answer = world.status()
        assert answer is not None and answer["running"] == 1 and len(proxies()) == 1
        caller.send_signal(signal.SIGTERM)
        assert caller.wait(timeout=60) == -signal.SIGTERM
    finally:
        caller.kill()
        for pid in proxies():
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: world.status() is not None and world.status()["running"] == 0, "the command's end")


def test_a_killed_caller_takes_its_command_down(world: World) -> None:
    answer = world.status()
    assert answer is not None
    caller = world.start(world.proxied, "check-access", "--timeout", "120")
    try:
        wait_for(lambda: len(commands_of(answer["pid"])) == 1, "the forked command")
        (command,) = commands_of(answer["pid"])
        caller.kill()
        caller.wait(timeout=60)
        wait_for(lambda: not alive(command), "the command's end once its caller is gone")
        wait_for(lambda: world.status() is not None and world.status()["running"] == 0, "the server's count")
    finally:
        caller.kill()
        for pid in proxies():
            os.kill(pid, signal.SIGKILL)


def test_a_changed_program_is_never_served(tmp_path: Path, runtime: Path) -> None:
    """A package installed beside the program (a directory on `sys.path` changed) ends the preloaded
    process: the command that found it runs in its own process, and so does every later one."""
    site = tmp_path / "site"
    site.mkdir()
    env = environment(runtime, PYTHONPATH=str(site), DAGSTER_HOME=str(tmp_path / "dagster"))
    root = write_checkout(tmp_path / "c")
    world = World(env, root, root)
    assert preload(env, "start").returncode == 0
    try:
        first = world.run(root, "plan")
        assert served(world) == 1
        (site / "newly_installed.py").write_text("", encoding="utf-8")
        second = world.run(root, "plan")
        assert (second.returncode, second.stdout, second.stderr) == (first.returncode, first.stdout, first.stderr)
        wait_for(lambda: world.status() is None, "the stale process's end")
        assert not list(runtime.glob("narwhal-assets/*.sock"))
    finally:
        preload(env, "stop")


def test_a_runtime_directory_others_can_enter_is_refused(tmp_path: Path, runtime: Path) -> None:
    shared = runtime / "narwhal-assets"
    shared.mkdir()
    os.chmod(shared, 0o755)
    env = environment(runtime)
    started = preload(env, "start")
    assert started.returncode == 2
    assert started.stderr == (f"deploy-hosts preload: error: {shared}: not a directory owned by uid {os.getuid()} "
                              "with mode 0700; not used\n")  # fmt: skip
    root = write_checkout(tmp_path / "c")
    done = World(env, root, root).run(root, "plan")  # a command still runs, in its own process
    assert done.returncode == 0, done.stderr
    assert list(shared.iterdir()) == []


def test_a_socket_path_past_the_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir(mode=0o700)
    started = preload(environment(deep), "start")
    assert started.returncode == 1
    assert started.stderr.startswith(f"deploy-hosts preload: error: {deep / 'narwhal-assets'}/preload-")
    assert started.stderr.endswith(".sock: cannot listen there: AF_UNIX path too long\n")


def test_start_status_and_stop(runtime: Path) -> None:
    env = environment(runtime)
    assert preload(env, "status").returncode == 1
    assert preload(env, "start").returncode == 0
    try:
        again = preload(env, "start")
        assert again.returncode == 0 and "already serves this environment" in again.stdout
        status = preload(env, "status")
        assert status.returncode == 0 and ": 0 commands served, 0 running, exits after 10 idle minutes" in status.stdout
    finally:
        stopped = preload(env, "stop")
    assert stopped.returncode == 0 and " stops" in stopped.stdout
    gone = preload(env, "status")
    assert (gone.returncode, gone.stdout) == (1, "no preloaded process serves this environment\n")

"""How destinations resolve through `ssh -G` (`ssh/resolver.py`): the cache follows every file an answer came
from, a `Match exec` config is asked every time, a hanging `ssh -G` is stopped at its deadline, refusals name
option and file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh import resolver
from narwhal_assets.ssh.destination import resolve_endpoint


@pytest.fixture
def counted_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ssh` on PATH logs each call's arguments (one line) to the returned file, then runs OpenSSH."""
    shim = tmp_path / "bin"
    shim.mkdir()
    log = tmp_path / "ssh-calls"
    real = next(p for p in os.environ["PATH"].split(os.pathsep) if (Path(p) / "ssh").is_file())
    (shim / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real}/ssh "$@"\n')
    (shim / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    resolver.clear_cache()
    log.touch()
    return log


def calls(log: Path, host: str) -> int:
    return sum(line.endswith(f"-- {host}") for line in log.read_text().splitlines())


def test_an_answer_is_cached_until_a_file_it_came_from_changes(
    tmp_path: Path, counted_ssh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited included file, a new file matching an Include glob, a changed variable a config names: each is
    seen at the next resolve; with nothing changed, OpenSSH is not asked again."""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "10-gpu.conf").write_text("Host gpu1\n  HostName 10.1.0.1\n")
    config = tmp_path / "config"
    config.write_text(f"Include {conf_d}/*.conf\nHost gpu1\n  User svc\n  IdentityFile ${{NARWHAL_KEYS}}/id\n")
    monkeypatch.setenv("NARWHAL_KEYS", "/keys/a")
    first = resolve_endpoint("gpu1", config)
    assert (first.host, first.user, first.identity_files) == ("10.1.0.1", "svc", ("/keys/a/id",))
    assert resolve_endpoint("gpu1", config) == first and calls(counted_ssh, "gpu1") == 1

    (conf_d / "10-gpu.conf").write_text("Host gpu1\n  HostName 10.1.0.11\n")
    assert resolve_endpoint("gpu1", config).host == "10.1.0.11" and calls(counted_ssh, "gpu1") == 2
    (conf_d / "05-port.conf").write_text("Host gpu1\n  Port 2201\n")  # a new file the glob matches
    assert resolve_endpoint("gpu1", config).port == 2201 and calls(counted_ssh, "gpu1") == 3
    monkeypatch.setenv("NARWHAL_KEYS", "/keys/b")  # a variable a config file names: OpenSSH is asked again
    assert resolve_endpoint("gpu1", config).identity_files == ("/keys/b/id",) and calls(counted_ssh, "gpu1") == 4
    resolve_endpoint("ops@gpu1", config)
    assert calls(counted_ssh, "gpu1") == 5, "another user@ is another query"
    assert resolve_endpoint("gpu1", config).port == 2201 and calls(counted_ssh, "gpu1") == 5


def test_an_edited_config_or_included_file_takes_effect_at_the_next_resolve(tmp_path: Path) -> None:
    """Parsed configs are kept per process (a fleet resolves each host several times); an edit is not missed."""
    included = tmp_path / "fleet.conf"
    included.write_text("Host gpu1\n  HostName 10.1.0.1\n")
    config = tmp_path / "config"
    config.write_text(f"Include {included}\nHost gpu2\n  HostName 10.1.0.2\n")
    assert [resolve_endpoint(alias, config).host for alias in ("gpu1", "gpu2", "gpu1")] == ["10.1.0.1", "10.1.0.2",
                                                                                          "10.1.0.1"]  # fmt: skip
    included.write_text("Host gpu1\n  HostName 10.1.0.11\n  Port 2201\n")
    config.write_text(config.read_text().replace("10.1.0.2", "10.1.0.12"))
    assert (resolve_endpoint("gpu1", config).host, resolve_endpoint("gpu1", config).port) == ("10.1.0.11", 2201)
    assert resolve_endpoint("gpu2", config).host == "10.1.0.12"


def test_a_config_with_match_exec_is_asked_every_time(tmp_path: Path, counted_ssh: Path) -> None:
    ran = tmp_path / "exec-ran"
    config = tmp_path / "config"
    config.write_text(f'Match host gpu1 exec "echo x >> {ran}; true"\n  User via-exec\n')
    assert [resolve_endpoint("gpu1", config).user for _ in range(3)] == ["via-exec"] * 3
    assert calls(counted_ssh, "gpu1") == 3 and len(ran.read_text().splitlines()) == 3


def test_a_hanging_ssh_g_is_stopped_at_its_deadline_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    config = tmp_path / "config"
    config.write_text(f'Match exec "echo $$ > {pid_file}; exec sleep 60"\n  User never\n')
    monkeypatch.setattr(resolver, "RESOLVE_TIMEOUT", 1.0)
    resolver.clear_cache()
    began = time.monotonic()
    with pytest.raises(InputError) as refused:
        resolve_endpoint("gpu1", config)
    assert time.monotonic() - began < 10
    assert str(refused.value) == (f"ssh config {config}: `ssh -G` did not answer within 1 s (a Match exec command "
                                  "that hangs?); stopped it")  # fmt: skip
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the Match exec command outlived its ssh -G"


@pytest.mark.parametrize(
    ("text", "said"),
    [("Host gpu1\n  Bogus yes\n", "line 2: Bad configuration option: bogus"),
     ("Host gpu1\n  Port ssh-nope\n", "line 2: Bad port"),
     ("Host gpu1\n  HostName \"unterminated\n", "line 2: invalid quotes")],
)  # fmt: skip
def test_a_config_openssh_rejects_is_refused_naming_file_and_line(tmp_path: Path, text: str, said: str) -> None:
    config = tmp_path / "config"
    config.write_text(text)
    with pytest.raises(InputError) as refused:
        resolve_endpoint("gpu1", config)
    [line] = refused.value.problems
    assert line.startswith(f"ssh config {config}: OpenSSH refuses it: {config}") and said in line

"""How destinations resolve through `ssh -G`: the cache follows every file an answer came from, a `Match exec`
config is asked every time, a hanging `ssh -G` is stopped at its deadline, refusals name option and file;
`deploy-hosts resolve` prints what the issue specifies."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from narwhal_assets.cli.main import main
from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh import resolver
from narwhal_assets.ssh.destination import resolve_endpoint

RESOLVE_FIELDS = ["destination", "hostname", "port", "user", "identity_files", "certificate_files",
                  "identities_only", "identity_agent", "host_key_alias", "known_hosts_names", "proxy_command",
                  "jumps", "connect_timeout", "not_applied"]  # fmt: skip


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


def test_host_key_alias_names_the_store_entry_whatever_the_port(tmp_path: Path) -> None:
    """What real ssh records (checked by hand with OpenSSH 9.2 and in tests/fleet): the lowercased alias
    alone, never `[alias]:port`; without an alias, `[host]:port` off port 22."""
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  Port 2222\n  HostKeyAlias Gpu-Alias\nHost b\n  HostName 10.0.0.2"
                      "\n  Port 2222\n")  # fmt: skip
    aliased, plain = resolve_endpoint("a", config), resolve_endpoint("b", config)
    assert (aliased.known_host, aliased.known_hosts_names) == (("gpu-alias", 22), ("gpu-alias",))
    assert plain.known_hosts_names == ("[10.0.0.2]:2222",)


def test_not_applied_lists_what_the_config_sets_and_these_connections_override(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                      "  ForwardAgent yes\n  SendEnv LANG LC_*\n  GSSAPIAuthentication yes\n")  # fmt: skip
    endpoint = resolve_endpoint("a", config)
    assert endpoint.refusal() is None
    listed = {(n.option, n.value) for n in endpoint.not_applied}
    # OpenSSH turns UpdateHostKeys off itself when UserKnownHostsFile is not its default
    assert listed == {("StrictHostKeyChecking", "false"), ("UserKnownHostsFile", "/dev/null"),
                      ("UpdateHostKeys", "false"),
                      ("ForwardAgent", "yes"), ("SendEnv", "LANG"), ("SendEnv", "LC_*"),
                      ("GSSAPIAuthentication", "yes")}  # fmt: skip


def resolve_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["resolve", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_resolve_prints_each_destination_in_order_and_exits_2_for_a_refused_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "id_test"
    key.write_text("not a key")
    (tmp_path / "id_test-cert.pub").write_text("ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQ=\n")
    config = tmp_path / "config"
    config.write_text(f"Host bastion\n  HostName 127.0.0.9\n  User jump\n  Port 2200\nHost app\n  HostName 10.0.0.7\n"
                      f"  ProxyJump bastion\n  IdentityFile {key}\n  IdentitiesOnly yes\n  ConnectTimeout 4\n"
                      "  ServerAliveInterval 9\nHost ssm\n  ProxyCommand aws ssm start-session --target %h\n"
                      "Host fd\n  ProxyCommand helper %h\n  ProxyUseFdpass yes\n")  # fmt: skip
    rc, out, _ = resolve_cli(capsys, "--ssh-config", str(config), "--json", "ops@app", "ssm", "fd")
    assert rc == 2
    app, ssm, fd = json.loads(out)
    assert list(app) == RESOLVE_FIELDS
    assert (app["destination"], app["hostname"], app["port"], app["user"]) == ("ops@app", "10.0.0.7", 22, "ops")
    assert (app["identity_files"], app["identities_only"], app["connect_timeout"]) == ([str(key)], True, 4)
    assert app["known_hosts_names"] == ["10.0.0.7"] and app["proxy_command"] is None
    [hop] = app["jumps"]
    assert list(hop) == RESOLVE_FIELDS and (hop["hostname"], hop["port"], hop["user"]) == ("127.0.0.9", 2200, "jump")
    assert hop["known_hosts_names"] == ["[127.0.0.9]:2200"] and hop["jumps"] == []
    alive = "overridden: keep-alives follow NARWHAL_SSH_ALIVE_INTERVAL and NARWHAL_SSH_ALIVE_COUNT"
    assert {"option": "ServerAliveInterval", "value": "9", "reason": alive} in app["not_applied"]
    assert ssm["proxy_command"] == "aws ssm start-session --target ssm" and ssm["jumps"] == []
    assert fd == {"destination": "fd", "error": f"ProxyUseFdpass yes (ssh config {config}): a ProxyCommand that "
                                                  "passes a connected descriptor is not supported"}  # fmt: skip

    rc, out, _ = resolve_cli(capsys, "--ssh-config", str(config), "ops@app", "fd")
    first, second = out.splitlines()
    assert rc == 2 and first.startswith("ops@app: ops@10.0.0.7:22 via jump@127.0.0.9:2200 keys ")
    assert "known as 10.0.0.7" in first and second.startswith("fd: refused: ProxyUseFdpass yes")
    rc, out, _ = resolve_cli(capsys, "--ssh-config", str(config), "ssm")
    assert rc == 0 and "(ProxyCommand aws ssm start-session --target ssm)" in out


def test_resolve_defaults_to_the_checkout_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "ssh_config").write_text("Host gpu1\n  HostName 10.9.0.1\n")
    (root / ".env").write_text("NARWHAL_NODE_1_SSH=gpu1\nNARWHAL_SSH_CONFIG=ssh_config\n")
    capsys.readouterr()
    assert main(["--root", str(root), "resolve", "--json", "gpu1"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hostname"] == "10.9.0.1"

"""`deploy-hosts resolve` (`cli/resolve.py`): what it prints for each destination, as JSON and as text, exit 2
for a refused one, and the checkout's ssh config by default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from narwhal_assets.cli.main import main

RESOLVE_FIELDS = ["destination", "hostname", "port", "user", "identity_files", "certificate_files",
                  "identities_only", "identity_agent", "host_key_alias", "known_hosts_names", "proxy_command",
                  "jumps", "connect_timeout", "not_applied"]  # fmt: skip


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

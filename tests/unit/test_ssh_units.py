"""Trust-store parsing, destination resolution and OpenSSH argv building, without a network."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import openssh_command
from narwhal_assets.ssh.trust import (
    HostKey,
    HostKeyChanged,
    HostKeyUnknown,
    KnownHostsStore,
    TrustMode,
    fingerprint_of,
    host_pattern,
)


def keypair(tmp_path: Path, name: str) -> HostKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    key_type, blob, *_ = (path.with_suffix(".pub")).read_text().split()
    return HostKey(key_type, blob)


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    key = keypair(tmp_path, "k")
    listed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True)
    assert fingerprint_of(base64.b64decode(key.blob_b64)) == listed.stdout.split()[1]


def test_lookup_honours_hashed_bracketed_wildcard_negated_and_revoked_entries(tmp_path: Path) -> None:
    a, b, c, d = (keypair(tmp_path, n) for n in "abcd")
    store_path = tmp_path / "known_hosts"
    store_path.write_text(
        "# a comment that must survive\n"
        f"{hashed('[10.0.0.5]:2222')} {a.key_type} {a.blob_b64}\n"
        f"*.fleet.example,!bad.fleet.example {b.key_type} {b.blob_b64}\n"
        f"@revoked gpu9 {c.key_type} {c.blob_b64}\n"
        f"@cert-authority *.ca.example {d.key_type} {d.blob_b64}\n"
    )
    store = KnownHostsStore(store_path)
    assert store.keys_for("10.0.0.5", 2222) == [a]
    assert store.keys_for("10.0.0.5", 22) == []
    assert store.keys_for("gpu1.fleet.example", 22) == [b]
    assert store.keys_for("bad.fleet.example", 22) == []
    assert store.keys_for("x.ca.example", 22) == []
    assert store.verify("h", "10.0.0.5", 2222, a, TrustMode.STRICT).outcome == "known"
    with pytest.raises(HostKeyChanged, match="revoked"):
        store.verify("h", "gpu9", 22, c, TrustMode.ACCEPT_NEW)


def test_accept_new_appends_without_rewriting_and_strict_refuses_unknown(tmp_path: Path) -> None:
    a, b = keypair(tmp_path, "a"), keypair(tmp_path, "b")
    store_path = tmp_path / "config" / "known_hosts"
    store_path.parent.mkdir()
    original = f"# keep me\n{hashed('other')} {b.key_type} {b.blob_b64}"  # no trailing newline
    store_path.write_text(original)
    store = KnownHostsStore(store_path)
    with pytest.raises(HostKeyUnknown, match="host node-1 \\(h1:22\\): host key SHA256:"):
        store.verify("node-1", "h1", 22, a, TrustMode.STRICT)
    assert store.verify("node-1", "h1", 22, a, TrustMode.ACCEPT_NEW).outcome == "added"
    text = store_path.read_text()
    assert text.startswith(original + "\n") and text.endswith(f"h1 {a.key_type} {a.blob_b64}\n")
    assert oct(store_path.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(HostKeyChanged) as changed:
        store.verify("node-1", "h1", 22, b, TrustMode.ACCEPT_NEW)
    assert a.fingerprint in str(changed.value) and b.fingerprint in str(changed.value)
    assert store_path.read_text() == text


def test_staged_store_writes_nothing_until_commit(tmp_path: Path) -> None:
    a, b = keypair(tmp_path, "a"), keypair(tmp_path, "b")
    store = KnownHostsStore(tmp_path / "known_hosts", staged=True)
    assert store.verify("node-1", "h1", 22, a, TrustMode.ACCEPT_NEW).outcome == "added"
    assert not store.path.exists()
    with pytest.raises(HostKeyChanged):
        store.verify("node-1", "h1", 22, b, TrustMode.ACCEPT_NEW)
    assert store.commit() == [a.fingerprint]
    assert store.keys_for("h1", 22) == [a]


def test_replace_requires_the_verified_fingerprint_and_keeps_other_lines(tmp_path: Path) -> None:
    a, b, other = keypair(tmp_path, "a"), keypair(tmp_path, "b"), keypair(tmp_path, "o")
    store_path = tmp_path / "known_hosts"
    store_path.write_text(f"# c\n{hashed('h1')} {a.key_type} {a.blob_b64}\nh2 {other.key_type} {other.blob_b64}\n")
    store = KnownHostsStore(store_path)
    before = store_path.read_bytes()
    with pytest.raises(HostKeyChanged, match="nothing changed"):
        store.replace("node-1", "h1", 22, b, a.fingerprint)
    assert store_path.read_bytes() == before
    store.replace("node-1", "h1", 22, b, b.fingerprint)
    assert store_path.read_text() == f"# c\nh2 {other.key_type} {other.blob_b64}\nh1 {b.key_type} {b.blob_b64}\n"


def test_host_pattern() -> None:
    assert host_pattern("h", 22) == "h" and host_pattern("h", 2222) == "[h]:2222"


def test_destination_resolution_follows_config_include_and_proxyjump(tmp_path: Path) -> None:
    included = tmp_path / "conf.d" / "fleet.conf"
    included.parent.mkdir()
    included.write_text("Host gpu2\n  HostName 10.1.0.2\n  User svc\n  Port 2202\n  ProxyJump bastion\n")
    config = tmp_path / "config"
    config.write_text(
        f"Include {tmp_path}/conf.d/*.conf\n"
        f"Host bastion\n  HostName 10.1.0.1\n  User jump\n  IdentityFile {tmp_path}/id\n  IdentitiesOnly yes\n"
    )
    endpoint = resolve_endpoint("gpu2", config)
    assert (endpoint.host, endpoint.port, endpoint.user) == ("10.1.0.2", 2202, "svc")
    [jump] = endpoint.jumps
    assert (jump.host, jump.user, jump.identities_only, jump.identity_files) == (
        "10.1.0.1", "jump", True, (f"{tmp_path}/id",),
    )  # fmt: skip
    assert resolve_endpoint("ops@gpu2", config).user == "ops"
    plain = resolve_endpoint("root@[198.18.0.9]:2200", None)
    assert (plain.host, plain.port, plain.user, plain.jumps) == ("198.18.0.9", 2200, "root", ())


@pytest.mark.parametrize("bad", ["-oProxyCommand=x", "a b", "", "h@[x]:99999"])
def test_bad_destinations_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(InputError) as caught:
        resolve_endpoint(bad, None)
    assert bad not in str(caught.value) or bad == ""


def test_openssh_command_is_strict_and_spells_out_proxyjump(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host b\n  HostName 10.1.0.1\nHost t\n  HostName 10.1.0.2\n  ProxyJump b\n")
    store = tmp_path / "kh"
    command = openssh_command(resolve_endpoint("u@t", config), store, config, remote_command="true")
    argv = command.argv
    for option in ("StrictHostKeyChecking=yes", f"UserKnownHostsFile={store}", "GlobalKnownHostsFile=/dev/null"):
        assert option in argv
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert "StrictHostKeyChecking=yes" in proxy and f"UserKnownHostsFile={store}" in proxy and "-W %h:%p" in proxy
    assert "ProxyJump=none" in argv and argv[-2:] == ["t", "true"]


def test_password_reaches_sshpass_through_a_pipe_only(tmp_path: Path) -> None:
    secret = "pw-SENTINEL-unit"
    command = openssh_command(resolve_endpoint("u@10.0.0.1", None), tmp_path / "kh", None, password=secret)
    assert secret not in repr(command) and all(secret not in a for a in command.argv)
    command.prepare_password_pipe()
    assert command.argv[:2] == ["sshpass", "-d"] and int(command.argv[2]) == command.pass_fds[0]
    assert os.read(command.pass_fds[0], 100) == secret.encode() + b"\n"
    os.close(command.pass_fds[0])

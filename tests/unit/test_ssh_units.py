"""Trust-store parsing, destination resolution and OpenSSH argv building, without a network."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from narwhal_assets.core.errors import HostKeyChanged, HostKeyRevoked, HostKeyUnknown, InputError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.ssh.access import make_connector, transport_bounds
from narwhal_assets.ssh.destination import resolve_endpoint
from narwhal_assets.ssh.openssh import MAX_PASSWORD_BYTES, openssh_command
from narwhal_assets.ssh.trust import HostKey, KnownHostsStore, TrustMode, fingerprint_of, host_pattern


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
    with pytest.raises(HostKeyRevoked, match="revoked"):
        store.verify("h", "gpu9", 22, c, TrustMode.ACCEPT_NEW)


@pytest.mark.parametrize(
    ("host", "port"),
    [("10.0.0.5", 2222), ("10.0.0.5", 22), ("gpu1.fleet.example", 22), ("bad.fleet.example", 22), ("gpu7", 22),
     ("GPU7", 22), ("h1.x", 22), ("h12.x", 22), ("h1.x", 2222)],
)  # fmt: skip
def test_lookup_finds_what_ssh_keygen_finds_in_file_order(tmp_path: Path, host: str, port: int) -> None:
    """OpenSSH is the oracle: `[` is literal (as in `[host]:port`), names compare without case, `*` and `?`
    are the wildcards, and several lines for one name come back in file order (plain and patterned mixed)."""
    a, b, c, d = (keypair(tmp_path, n) for n in "abcd")
    store_path = tmp_path / "known_hosts"
    store_path.write_text(
        f"[10.0.0.5]:2222 {a.key_type} {a.blob_b64}\n"
        f"*.Fleet.example,!bad.fleet.example {b.key_type} {b.blob_b64}\n"
        f"GPU7 {c.key_type} {c.blob_b64}\n"
        f"h?.x,[h1.x]:2222 {d.key_type} {d.blob_b64}\n"
        f"[10.0.0.5]:2222,gpu7 {d.key_type} {d.blob_b64}\n"
    )
    name = host_pattern(host, port)
    found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(store_path)], capture_output=True, text=True,
                           check=False).stdout  # fmt: skip
    expected = [line.split()[2] for line in found.splitlines() if line and not line.startswith("#")]
    assert [key.blob_b64 for key in KnownHostsStore(store_path).keys_for(host, port)] == expected


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
    [jump] = endpoint.hops()
    assert (jump.host, jump.user, jump.identities_only, jump.identity_files) == (
        "10.1.0.1", "jump", True, (f"{tmp_path}/id",),
    )  # fmt: skip
    assert resolve_endpoint("ops@gpu2", config).user == "ops"
    plain = resolve_endpoint("root@[198.18.0.9]:2200", None)
    assert (plain.host, plain.port, plain.user, plain.hops()) == ("198.18.0.9", 2200, "root", [])


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


@pytest.mark.parametrize("bad", ["-oProxyCommand=x", "a b", "", "h@[x]:99999"])
def test_bad_destinations_are_refused_without_echoing_them(bad: str) -> None:
    with pytest.raises(InputError) as caught:
        resolve_endpoint(bad, None)
    assert bad not in str(caught.value) or bad == ""


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


def test_a_key_listed_plainly_and_as_revoked_is_refused_on_every_path(tmp_path: Path) -> None:
    a, b = keypair(tmp_path, "a"), keypair(tmp_path, "b")
    store_path = tmp_path / "known_hosts"
    for plain in ("h1", hashed("h1")):
        store_path.write_text(f"{plain} {a.key_type} {a.blob_b64}\n@revoked h1 {a.key_type} {a.blob_b64}\n")
        store = KnownHostsStore(store_path)
        for mode in TrustMode:
            with pytest.raises(HostKeyRevoked) as refused:
                store.verify("node-1", "h1", 22, a, mode)
            assert "HOST KEY REVOKED" in str(refused.value) and a.fingerprint in str(refused.value)
            assert "deploy-hosts trust" not in str(refused.value), "a revoked key must not be trusted again"
        before = store_path.read_bytes()
        with pytest.raises(HostKeyRevoked):
            store.replace("node-1", "h1", 22, a, a.fingerprint)
        assert store_path.read_bytes() == before
    # accept-new: staged while unknown, revoked (and listed) before the commit: the commit refuses it
    staged = KnownHostsStore(tmp_path / "staged_known_hosts", staged=True)
    assert staged.verify("node-1", "h1", 22, a, TrustMode.ACCEPT_NEW).outcome == "added"
    assert staged.verify("node-2", "h2", 22, b, TrustMode.ACCEPT_NEW).outcome == "added"
    staged.path.write_text(f"h1 {a.key_type} {a.blob_b64}\n@revoked * {a.key_type} {a.blob_b64}\n")
    with pytest.raises(HostKeyRevoked):
        staged.commit()


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


def write_checkout(root: Path, *lines: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    env = ["NARWHAL_NODE_1_SSH=u@[127.0.0.1]:1", "NARWHAL_NODE_2_SSH=u@[127.0.0.1]:1", *lines]
    (root / ".env").write_text("\n".join(env) + "\n", encoding="utf-8")
    return root


def run_cli(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`deploy-hosts` as its own process (as an operator runs it), DAGSTER_HOME inside the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env["DAGSTER_HOME"] = str(root / "runs" / "dagster")
    argv = [sys.executable, "-m", "narwhal_assets", "--root", str(root), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_tunnel_with_a_100kb_password_exits_2_naming_the_variable_without_hanging(tmp_path: Path) -> None:
    secret = "SENTINEL" + "q" * 100_000
    root = write_checkout(tmp_path / "c", f"NARWHAL_NODE_2_SSH_PASSWORD={secret}")
    try:
        done = run_cli(root, "tunnel", "--role", "engine-2", "--forward", "18080:8000", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("tunnel hung handing over a 100 KB password")
    assert done.returncode == 2, done.stderr
    assert "NARWHAL_NODE_2_SSH_PASSWORD: value is longer than 512 bytes" in done.stderr
    assert "SENTINEL" not in done.stderr + done.stdout


@pytest.mark.parametrize("fingerprint", ["SHA256:short", "MD5:aa:bb", "SHA256:" + "A" * 43 + "!", ""])
def test_trust_with_a_malformed_fingerprint_exits_2_before_connecting(tmp_path: Path, fingerprint: str) -> None:
    root = write_checkout(tmp_path / "c")
    done = run_cli(root, "trust", "--host", "node-1", "--fingerprint", fingerprint)
    assert done.returncode == 2, done.stderr
    assert "--fingerprint: expected SHA256:<43 base64 characters>" in done.stderr
    assert "cannot connect" not in done.stderr


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_ssh_config_naming_a_missing_file_or_a_directory_exits_2_naming_the_variable(
    tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "ssh_config"
    if kind == "directory":
        target.mkdir()
    root = write_checkout(tmp_path / "c", f"NARWHAL_SSH_CONFIG={target}")
    with pytest.raises(InputError, match=r"^NARWHAL_SSH_CONFIG: .* (does not exist|is a directory)"):
        _ = Settings.load(root).ssh_config_path
    done = run_cli(root, "check-access", "--timeout", "2")
    assert done.returncode == 2, done.stderr
    assert "error: NARWHAL_SSH_CONFIG:" in done.stderr and "cannot connect" not in done.stderr


def test_ssh_config_default_and_relative_values(tmp_path: Path) -> None:
    root = write_checkout(tmp_path / "c", "NARWHAL_SSH_CONFIG=conf/ssh_config")
    (root / "conf").mkdir()
    (root / "conf" / "ssh_config").write_text("Host x\n  HostName 10.0.0.1\n")
    assert Settings.load(root).ssh_config_path == root / "conf" / "ssh_config"
    unset = write_checkout(tmp_path / "d")
    home = Path("~/.ssh/config").expanduser()
    assert Settings.load(unset).ssh_config_path == (home if home.is_file() else None)


@pytest.mark.parametrize(
    ("name", "value"),
    [("NARWHAL_SSH_ALIVE_INTERVAL", "0"), ("NARWHAL_SSH_ALIVE_INTERVAL", "soon"),
     ("NARWHAL_SSH_ALIVE_COUNT", "2.5"), ("NARWHAL_SSH_HOST_TIMEOUT", "-1")],
)  # fmt: skip
def test_transport_bounds_out_of_range_exit_2_naming_the_variable(tmp_path: Path, name: str, value: str) -> None:
    root = write_checkout(tmp_path / "c", f"{name}={value}")
    with pytest.raises(InputError, match=f"^{name}: must be"):
        transport_bounds(Settings.load(root))
    good = write_checkout(tmp_path / "g", "NARWHAL_SSH_ALIVE_INTERVAL=1.5", "NARWHAL_SSH_ALIVE_COUNT=2")
    connector = make_connector(Settings.load(good), TrustMode.STRICT)
    assert (connector.alive_interval, connector.alive_count, connector.host_timeout) == (1.5, 2, 3600.0)


def test_check_access_timeout_must_be_positive(tmp_path: Path) -> None:
    done = run_cli(write_checkout(tmp_path / "c"), "check-access", "--timeout", "0")
    assert done.returncode == 2 and "expected seconds from 0.1 to 3600" in done.stderr


def test_a_private_key_is_parsed_once_per_version_of_its_file(tmp_path: Path) -> None:
    """Loaded once per process for many hosts, yet a key rewritten or replaced in place, or protected by a
    passphrase since, is read again: what authenticates is always what the file holds now."""
    from narwhal_assets.ssh.identities import _private as _load_key

    def keygen(name: str, passphrase: str = "") -> Path:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(tmp_path / name)],
                       check=True)  # fmt: skip
        return tmp_path / name

    path, other, locked = keygen("id"), keygen("other"), keygen("locked", "secret")
    path = str(path)
    first = _load_key(path)
    assert first is not None and _load_key(path) is first, "the same file version is parsed once"
    expected = paramiko.PKey.from_path(other).fingerprint
    Path(path).write_bytes(other.read_bytes())  # rewritten in place: another key, the same size
    reloaded = _load_key(path)
    assert reloaded is not None and reloaded.fingerprint == expected != first.fingerprint
    os.replace(locked, path)  # renamed over it: a key that needs a passphrase is skipped
    assert _load_key(path) is None
    Path(path).unlink()
    assert _load_key(path) is None

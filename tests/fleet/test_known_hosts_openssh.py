"""Differential: real OpenSSH 9.2 and the trust store give the same verdict on the same known-hosts store.

For every line form (names and case, hashed names, `[host]:port` and the port-22 fallback, HostKeyAlias,
patterns and negation, markers, `@revoked` keys and CAs, `@cert-authority` host certificates, bytes that are
not line breaks, keys OpenSSH rejects), `ssh -o StrictHostKeyChecking=yes -o UserKnownHostsFile=<store>`
connects to a real sshd and its verdict (accept, changed, revoked, unknown) is compared with
`KnownHostsStore.verify` on the key paramiko negotiates with the same sshd.

The sshd runs in inetd mode behind `ProxyCommand` (`sshd -i`, in a private mount namespace that gives it
its own /run/sshd): no port is opened, and ssh looks up whatever name and port the case gives (`-p 22`
included), which is what the verdict depends on. Each sshd has one host key (and maybe a certificate for
it); paramiko is offered OpenSSH's default HostKeyAlgorithms, certificates first, ordered for the case's
store by `KnownHostsStore.host_key_algorithms` as OpenSSH orders them, so both clients are presented the same.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest
from helpers.sshkeys import Key, hashed, make_key, sign_host

from narwhal_assets.core.errors import HostKeyChanged, HostKeyRevoked, HostKeyUnknown
from narwhal_assets.ssh.transport import Connector, HostAccess
from narwhal_assets.ssh.trust import HostKey, KnownHostsStore, TrustMode

pytestmark = [pytest.mark.fleet, pytest.mark.filterwarnings("ignore::narwhal_assets.ssh.trust.KnownHostsLineIgnored")]

SSHD = "/usr/sbin/sshd"
# OpenSSH 9.2's default HostKeyAlgorithms, less the security-key ones paramiko does not have
HOST_KEY_ALGORITHMS = [
    *(f"{name}-cert-v01@openssh.com" for name in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                                                  "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256")),
    "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "rsa-sha2-512", "rsa-sha2-256",
]  # fmt: skip
PROXY = """#!/bin/sh
# sshd on stdin/stdout, with a private /run (root's sshd needs /run/sshd; the machine's own is untouched)
exec unshare --mount --propagation private -- /bin/sh -c \
  'mount -t tmpfs -o size=1m,mode=755 narwhal-known-hosts /run && mkdir -m 755 /run/sshd && exec {sshd} -i -f "$0"' "$1"
"""
SSHD_CONFIG = """HostKey {key}
{certificate}AuthorizedKeysFile {authorized}
StrictModes no
PermitRootLogin yes
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PidFile none
LogLevel ERROR
"""


@dataclass(frozen=True)
class Keys:
    """The lab's keys: each server's host key, another key (an attacker's), the host CA and certificate."""

    host: Key
    rsa: Key
    ecdsa: Key
    other: Key
    ca: Key
    cert: Key


@dataclass(frozen=True)
class Case:
    """One store, and where ssh goes: `host` as given to ssh (or its HostName), `port`, `alias`."""

    store: Callable[[Keys], bytes]
    expected: str
    host: str = "localhost"
    port: int = 22
    server: str = "ed25519"
    alias: str | None = None


def line(*parts: bytes | str) -> bytes:
    return b" ".join(p.encode() if isinstance(p, str) else p for p in parts) + b"\n"


def plain(name: str = "localhost") -> Callable[[Keys], bytes]:
    """The store most cases add to: `name` pins the server's key."""
    return lambda k: line(name, k.host.line)


CASES: dict[str, Case] = {
    # names and case: OpenSSH lower-cases the host name and the HostKeyAlias before looking them up
    "plain name": Case(plain(), "accept"),
    "another key recorded": Case(lambda k: line("localhost", k.other.line), "changed"),
    "empty store": Case(lambda k: b"", "unknown"),
    "pattern in upper case": Case(plain("LOCALHOST"), "accept"),
    "hashed name, HostName in upper case": Case(
        lambda k: line(hashed("localhost"), k.host.line), "accept", host="LocalHost"
    ),
    "hashed name pins another key, HostName in upper case": Case(
        lambda k: line(hashed("localhost"), k.other.line), "changed", host="LocalHost"
    ),
    "hashed upper-case name": Case(lambda k: line(hashed("LocalHost"), k.host.line), "unknown", host="LocalHost"),
    "IP address": Case(plain("127.0.0.1"), "accept", host="127.0.0.1"),
    # HostKeyAlias: the alias alone (no port, no fallback to the host name)
    "alias, hashed in lower case": Case(lambda k: line(hashed("myalias"), k.host.line), "accept", alias="MyAlias"),
    "alias, hashed as written": Case(lambda k: line(hashed("MyAlias"), k.host.line), "unknown", alias="MyAlias"),
    "alias on port 2222, plain alias line": Case(plain("myalias"), "accept", port=2222, alias="myalias"),
    "alias on port 2222, bracketed alias line": Case(plain("[myalias]:2222"), "unknown", port=2222, alias="myalias"),
    "alias, only the host name recorded": Case(plain(), "unknown", alias="myalias"),
    "alias pins another key, the host name this one": Case(
        lambda k: line("myalias", k.other.line) + line("localhost", k.host.line), "changed", alias="myalias"
    ),
    # [host]:port, and the plain name tried when the bracketed one records no key
    "port 2222, plain line with the key": Case(plain(), "accept", port=2222),
    "port 2222, plain line with another key": Case(lambda k: line("localhost", k.other.line), "unknown", port=2222),
    "port 2222, plain line revoked": Case(
        lambda k: line("localhost", k.host.line) + line("@revoked localhost", k.host.line), "revoked", port=2222
    ),
    "port 2222, bracketed line with another key": Case(
        lambda k: line("[localhost]:2222", k.other.line) + line("localhost", k.host.line), "changed", port=2222
    ),
    "port 22, bracketed line": Case(plain("[localhost]:22"), "unknown"),
    "port 2222, bracketed wildcard port": Case(plain("[localhost]:*"), "accept", port=2222),
    "port 2222, hashed bracketed name": Case(
        lambda k: line(hashed("[localhost]:2222"), k.host.line), "accept", port=2222
    ),
    # the file is split on \n only, each line ends at a NUL
    "form feed in a comment": Case(lambda k: b"# c\x0c" + line("localhost", k.host.line), "unknown"),
    "file separator in a comment": Case(lambda k: b"# c\x1c" + line("localhost", k.host.line), "unknown"),
    "U+2028 in a comment": Case(lambda k: "# c\u2028".encode() + line("localhost", k.host.line), "unknown"),
    "CRLF line end": Case(lambda k: line("localhost", k.host.line)[:-1] + b"\r\n", "accept"),
    "no final newline": Case(lambda k: line("localhost", k.host.line)[:-1], "accept"),
    "NUL after the key": Case(lambda k: line("localhost", k.host.line + b"\0junk"), "accept"),
    "NUL inside the name": Case(plain("local\0host"), "unknown"),
    "latin-1 comment line": Case(lambda k: b"# caf\xe9\n" + line("localhost", k.host.line), "accept"),
    "latin-1 in a key line's comment": Case(lambda k: line("localhost", k.host.line, b"caf\xe9"), "accept"),
    "tabs between fields": Case(lambda k: b"\tlocalhost\t" + k.host.line.replace(b" ", b"\t") + b"\n", "accept"),
    "comment right after the names": Case(plain("localhost #c"), "unknown"),
    # patterns
    "negated pattern only": Case(plain("!foo"), "unknown"),
    "negation wins over a wildcard": Case(plain("*,!localhost"), "unknown"),
    "question mark": Case(plain("localhos?"), "accept"),
    "hashed name in a list": Case(lambda k: line(hashed("localhost") + b",foo", k.host.line), "unknown"),
    "NBSP inside a name": Case(plain("localhost\u00a0"), "unknown"),
    "pattern of 1023 bytes": Case(plain("a" * 1023 + ",localhost"), "unknown"),
    "pattern of 1022 bytes": Case(plain("a" * 1022 + ",localhost"), "accept"),
    "hashed name without padding": Case(lambda k: line(hashed("localhost").rstrip(b"="), k.host.line), "unknown"),
    # keys: the type is one of OpenSSH's key or signature algorithm names, the base64 and the blob parse
    "undecodable key": Case(lambda k: line("localhost ssh-ed25519 AAAA!!!"), "unknown"),
    "undecodable key, then the key": Case(
        lambda k: line("localhost ssh-ed25519 AAAA!!!") + line("localhost", k.host.line), "accept"
    ),
    "type names another algorithm": Case(lambda k: line("localhost ssh-rsa", k.host.blob), "unknown"),
    "short type name": Case(lambda k: line("localhost ED25519", k.host.blob), "unknown"),
    "key of another type recorded": Case(lambda k: line("localhost", k.rsa.line), "changed"),
    "rsa-sha2-512 names an RSA key": Case(lambda k: line("localhost rsa-sha2-512", k.rsa.blob), "accept", server="rsa"),
    "carriage return inside the base64": Case(
        lambda k: line("localhost", k.host.key_type, k.host.blob[:10] + "\r" + k.host.blob[10:]), "accept"
    ),
    "base64 without padding": Case(
        lambda k: line("localhost", k.ecdsa.key_type, k.ecdsa.blob.rstrip("=")), "unknown", server="ecdsa"
    ),
    "vertical tab before the padding": Case(
        lambda k: line("localhost", k.ecdsa.key_type, k.ecdsa.blob[:-1] + "\v="), "accept", server="ecdsa"
    ),
    "ECDSA key under another curve's name": Case(
        lambda k: line("localhost ecdsa-sha2-nistp384", k.ecdsa.blob), "unknown", server="ecdsa"
    ),
    "trailing bytes in the key": Case(
        lambda k: line("localhost", k.ecdsa.key_type, base64.b64encode(base64.b64decode(k.ecdsa.blob) + b"\0")),
        "unknown",
        server="ecdsa",
    ),
    # markers
    "unknown marker": Case(plain("@foo localhost"), "unknown"),
    "two markers, then the key": Case(
        lambda k: line("@revoked @revoked localhost", k.host.line) + line("localhost", k.host.line), "accept"
    ),
    "tab after a marker": Case(
        lambda k: line("@revoked\tlocalhost", k.host.line) + line("localhost", k.host.line), "accept"
    ),
    "revoked for every name": Case(
        lambda k: line("localhost", k.host.line) + line("@revoked *", k.host.line), "revoked"
    ),
    "revoked for another name": Case(
        lambda k: line("localhost", k.host.line) + line("@revoked other", k.host.line), "accept"
    ),
    "revoked as rsa-sha2-512": Case(
        lambda k: line("localhost", k.rsa.line) + line("@revoked localhost rsa-sha2-512", k.rsa.blob),
        "revoked",
        server="rsa",
    ),
    "revoked in a list with NBSP": Case(
        lambda k: line("@revoked foo\u00a0,localhost", k.host.line) + line("localhost", k.host.line), "revoked"
    ),
    # host certificates (the certificate lists localhost and 127.0.0.1, valid now)
    "CA only": Case(lambda k: line("@cert-authority localhost", k.ca.line), "accept", server="cert"),
    "CA for every name, port 2222": Case(
        lambda k: line("@cert-authority *", k.ca.line), "accept", port=2222, server="cert"
    ),
    "CA for the plain name, port 2222": Case(
        lambda k: line("@cert-authority localhost", k.ca.line), "accept", port=2222, server="cert"
    ),
    "CA for another name, the key recorded": Case(
        lambda k: line("@cert-authority other", k.ca.line) + line("localhost", k.host.line), "accept", server="cert"
    ),
    "CA, and another key recorded": Case(
        lambda k: line("@cert-authority localhost", k.ca.line) + line("localhost", k.other.line),
        "accept",
        server="cert",
    ),
    "CA revoked, the key recorded": Case(
        lambda k: line("@revoked *", k.ca.line) + line("localhost", k.host.line), "revoked", server="cert"
    ),
    "CA revoked for another name": Case(
        lambda k: line("@revoked other", k.ca.line) + line("localhost", k.host.line), "accept", server="cert"
    ),
    "certificate revoked": Case(
        lambda k: line("@revoked localhost", k.cert.line) + line("localhost", k.host.line), "revoked", server="cert"
    ),
    "certificate revoked, server without a certificate": Case(
        lambda k: line("@revoked localhost", k.cert.line) + line("localhost", k.host.line), "revoked"
    ),
    "CA and the host key revoked": Case(
        lambda k: line("@cert-authority localhost", k.ca.line) + line("@revoked localhost", k.host.line),
        "revoked",
        server="cert",
    ),
    "CA revoked, server without a certificate": Case(
        lambda k: line("@revoked *", k.ca.line) + line("localhost", k.host.line), "accept"
    ),
    "CA, HostName in upper case": Case(
        lambda k: line("@cert-authority localhost", k.ca.line), "accept", host="LocalHost", server="cert"
    ),
    "CA, alias that is a principal": Case(
        lambda k: line("@cert-authority localhost", k.ca.line), "accept", host="other", server="cert", alias="LocalHost"
    ),
    "CA, alias that is not a principal": Case(
        lambda k: line("@cert-authority foo", k.ca.line), "unknown", server="cert", alias="foo"
    ),
    "CA for every name, not a principal": Case(
        lambda k: line("@cert-authority *", k.ca.line), "unknown", host="other", server="cert"
    ),
    "CA for every name, not a principal, key recorded": Case(
        lambda k: line("@cert-authority *", k.ca.line) + line("other", k.host.line),
        "accept",
        host="other",
        server="cert",
    ),
    "CA, certificate expired": Case(
        lambda k: line("@cert-authority localhost", k.ca.line), "unknown", server="expired"
    ),
    "CA, certificate expired, key recorded": Case(
        lambda k: line("@cert-authority localhost", k.ca.line) + line("localhost", k.host.line),
        "accept",
        server="expired",
    ),
    "certificate on a plain line": Case(lambda k: line("localhost", k.cert.line), "changed", server="cert"),
    "CA, server without a certificate": Case(lambda k: line("@cert-authority localhost", k.ca.line), "unknown"),
}


@dataclass
class Lab:
    root: Path
    keys: Keys
    proxies: dict[str, str]
    openssh: dict[str, str]
    negotiated: dict[tuple[str, tuple[str, ...]], HostKey]

    def presented(self, server: str, algorithms: list[str] | None) -> HostKey:
        """The key paramiko is presented by `server` when it offers `algorithms` (None: paramiko's own)."""
        order = (server, tuple(algorithms or ()))
        if order not in self.negotiated:
            self.negotiated[order] = _negotiated(self.proxies[server], algorithms)
        return self.negotiated[order]


def _server(root: Path, name: str, key: Key, certificate: Key | None = None) -> str:
    """An sshd config for one host key (and certificate); returns the ProxyCommand that runs it."""
    config = root / f"sshd_{name}"
    cert_line = f"HostCertificate {certificate.public}\n" if certificate else ""
    config.write_text(SSHD_CONFIG.format(key=key.path, certificate=cert_line, authorized=root / "authorized_keys"))
    return f"{root / 'proxy'} {config}"


def _openssh_verdict(lab_root: Path, proxies: dict[str, str], name: str, case: Case, keys: Keys) -> str:
    """What `ssh` decides for this case: accept (it ran `true`), revoked, changed or unknown."""
    store = lab_root / "stores" / f"{abs(hash(name))}"
    store.write_bytes(case.store(keys))
    argv = ["ssh", "-F", "/dev/null", "-o", f"ProxyCommand={proxies[case.server]}",
            "-o", f"UserKnownHostsFile={store}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no", "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-i", str(lab_root / "user"),
            "-p", str(case.port), "-o", f"HostName={case.host}"]  # fmt: skip
    if case.alias is not None:
        argv += ["-o", f"HostKeyAlias={case.alias}"]
    done = subprocess.run([*argv, "root@target", "true"], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 0:
        return "accept"
    if "REVOKED HOST KEY" in done.stderr:
        return "revoked"
    if "HOST IDENTIFICATION HAS CHANGED" in done.stderr:
        return "changed"
    if "host key is known for" in done.stderr and "strict checking" in done.stderr:
        return "unknown"
    return f"error: {done.stderr.strip()[-300:]}"


def _negotiated(proxy: str, algorithms: list[str] | None) -> HostKey:
    """The host key (or certificate) paramiko is presented over this sshd when it offers `algorithms`."""
    transport = paramiko.Transport(paramiko.ProxyCommand(proxy))
    try:
        if algorithms is not None:
            transport.get_security_options().key_types = algorithms
        transport.start_client(timeout=30)
        key = transport.get_remote_server_key()
    finally:
        transport.close()
    blob = key.public_blob
    if blob is not None:
        return HostKey(blob.key_type, base64.b64encode(blob.key_blob).decode())
    return HostKey(key.get_name(), key.get_base64())


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """Keys, one sshd config per server and OpenSSH's verdict on every case (ssh runs in parallel: each waits
    mostly on process start-up)."""
    if not os.access(SSHD, os.X_OK):
        pytest.fail(f"{SSHD} is missing (Debian package openssh-server)")
    root = tmp_path_factory.mktemp("openssh")
    (root / "stores").mkdir()
    ed25519, rsa, ecdsa = (make_key(root, f"host_{kind}", kind) for kind in ("ed25519", "rsa", "ecdsa"))
    other, ca, user = make_key(root, "other"), make_key(root, "ca"), make_key(root, "user")
    cert = sign_host(ca, ed25519, "valid", "-n", "localhost,127.0.0.1", "-V", "-5m:+1d")
    expired = sign_host(ca, ed25519, "expired", "-n", "localhost", "-V", "20200101:20200102")
    keys = Keys(ed25519, rsa, ecdsa, other, ca, cert)
    (root / "authorized_keys").write_bytes(user.public.read_bytes())
    (root / "proxy").write_text(PROXY.format(sshd=SSHD))
    (root / "proxy").chmod(0o755)
    proxies = {"ed25519": _server(root, "ed25519", ed25519), "rsa": _server(root, "rsa", rsa),
               "ecdsa": _server(root, "ecdsa", ecdsa), "cert": _server(root, "cert", ed25519, cert),
               "expired": _server(root, "expired", ed25519, expired)}  # fmt: skip
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda item: _openssh_verdict(root, proxies, *item, keys), CASES.items()))
    return Lab(root, keys, proxies, dict(zip(CASES, verdicts, strict=True)), {})


def _store_verdict(store: KnownHostsStore, case: Case, presented: HostKey) -> tuple[str, str]:
    try:
        store.verify("h", case.host, case.port, presented, TrustMode.STRICT, alias=case.alias)
    except HostKeyRevoked as exc:
        return "revoked", str(exc)
    except HostKeyChanged as exc:
        return "changed", str(exc)
    except HostKeyUnknown as exc:
        return "unknown", str(exc)
    return "accept", ""


@pytest.mark.parametrize("name", list(CASES))
def test_the_store_gives_openssh_verdict(lab: Lab, name: str, tmp_path: Path) -> None:
    case = CASES[name]
    assert lab.openssh[name] == case.expected, f"OpenSSH itself decided otherwise than this case expects: {name}"
    path = tmp_path / "known_hosts"
    path.write_bytes(case.store(lab.keys))
    store = KnownHostsStore(path)
    algorithms = store.host_key_algorithms(case.host, case.port, HOST_KEY_ALGORITHMS, alias=case.alias)
    verdict, _ = _store_verdict(store, case, lab.presented(case.server, algorithms))
    assert verdict == lab.openssh[name]


def test_a_ca_trusted_host_offering_its_plain_key_is_refused_naming_the_ca_line(lab: Lab, tmp_path: Path) -> None:
    """paramiko's own preference (plain key algorithms first) gets the plain key even from a host with a
    certificate; the CA line cannot vouch for it, and neither mode enrols it: the refusal says why."""
    presented = lab.presented("cert", None)
    assert presented.key_type == "ssh-ed25519"
    path = tmp_path / "known_hosts"
    path.write_bytes(b"# CA\n" + line("@cert-authority localhost", lab.keys.ca.line))
    for mode in TrustMode:
        with pytest.raises(HostKeyUnknown, match=r"line 2 trusts a certificate authority .* no certificate signed"):
            KnownHostsStore(path).verify("h", "localhost", 22, presented, mode)
    assert path.read_bytes() == b"# CA\n" + line("@cert-authority localhost", lab.keys.ca.line)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case.server != "ed25519"])
def test_the_transport_itself_is_presented_what_openssh_is_and_reaches_its_verdict(
    lab: Lab, name: str, tmp_path: Path
) -> None:
    """The project's own connector (ssh -G resolution, its host key algorithm order, ProxyCommand to the same
    sshd) reads the key or certificate the server presents and the store judges it as OpenSSH did: a host
    certificate is asked for where an @cert-authority line covers the host, so an @revoked CA is seen."""
    case = CASES[name]
    path = tmp_path / "known_hosts"
    path.write_bytes(case.store(lab.keys))
    config = tmp_path / "ssh_config"
    alias = f"  HostKeyAlias {case.alias}\n" if case.alias else ""
    config.write_text(f"Host target\n  HostName {case.host}\n  Port {case.port}\n  ProxyCommand "
                      f"{lab.proxies[case.server]}\n{alias}")  # fmt: skip
    store = KnownHostsStore(path)
    connector = Connector(store=store, mode=TrustMode.STRICT, ssh_config=config)
    endpoint, presented = connector.presented_key(HostAccess("h", "NARWHAL_NODE_1_SSH", "target"))
    verdict, _ = _store_verdict(store, Case(case.store, case.expected, endpoint.host, endpoint.port, case.server,
                                            endpoint.host_key_alias), presented)  # fmt: skip
    assert verdict == lab.openssh[name]

"""The trust store's reading and writing of every known-hosts line form, as OpenSSH 9.2 does (the verdicts
here are OpenSSH's, checked against real ssh in tests/fleet/test_known_hosts_openssh.py)."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.sshkeys import Key, hashed, make_key, sign_host
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal_assets.core.errors import HostKeyChanged, HostKeyError, HostKeyRevoked, HostKeyUnknown
from narwhal_assets.ssh.sshkey import KeyProblem, parse_blob
from narwhal_assets.ssh.trust import (
    HostKey,
    KnownHostsLineIgnored,
    KnownHostsStore,
    StagedKey,
    TrustMode,
    fingerprint_of,
    host_pattern,
    known_hosts_name,
)

STRICT, NEW = TrustMode.STRICT, TrustMode.ACCEPT_NEW
pytestmark = pytest.mark.filterwarnings("ignore::narwhal_assets.ssh.trust.KnownHostsLineIgnored")
StoreAt = Callable[..., KnownHostsStore]


class Keys:
    """ed25519 keys a-c, an RSA key, a host CA and certificates of `a` (valid, expired, user, other name)."""

    def __init__(self, root: Path):
        self.a, self.b, self.c = (make_key(root, name) for name in "abc")
        self.rsa = make_key(root, "rsa", "rsa")
        self.ca = make_key(root, "ca")
        self.cert = sign_host(self.ca, self.a, "valid", "-n", "gpu1,10.0.0.5", "-V", "-5m:+1d")
        self.expired = sign_host(self.ca, self.a, "expired", "-n", "gpu1", "-V", "20200101:20200102")
        self.anyname = sign_host(self.ca, self.a, "anyname", "-V", "-5m:+1d")
        user = self.a.path.with_name("a-user")
        user.write_bytes(self.a.path.read_bytes())
        user.with_name("a-user.pub").write_bytes(self.a.public.read_bytes())
        subprocess.run(["ssh-keygen", "-q", "-s", str(self.ca.path), "-I", "user", "-n", "gpu1", str(user) + ".pub"],
                       check=True)  # fmt: skip
        user.with_name("a-user-cert.pub").rename(user.with_name("a-user.pub"))
        self.user_cert = Key(user)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


def host_key(key: Key) -> HostKey:
    """What the transport passes for a presented key (or certificate)."""
    return HostKey(key.key_type, key.blob)


def line(*parts: bytes | str) -> bytes:
    return b" ".join(p.encode() if isinstance(p, str) else p for p in parts) + b"\n"


@pytest.fixture
def store_at(tmp_path: Path) -> StoreAt:
    """`store_at(data)`: a store holding exactly these bytes (each call replaces the file)."""

    def make(data: bytes, *, staged: bool = False) -> KnownHostsStore:
        path = tmp_path / "config" / "ssh.known_hosts"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        return KnownHostsStore(path, staged=staged)

    return make


def verdict(store: KnownHostsStore, host: str, port: int, key: Key, mode: TrustMode = STRICT, **kw: str) -> str:
    try:
        return store.verify("node-1", host, port, host_key(key), mode, **kw).outcome
    except HostKeyRevoked:
        return "revoked"
    except HostKeyChanged:
        return "changed"
    except HostKeyUnknown:
        return "unknown"


# ------------------------------------------------------------------------------------------- names and case


def test_the_host_name_is_looked_up_in_lower_case_so_a_hashed_name_pins_it(keys: Keys, store_at: StoreAt) -> None:
    """`HostName LocalHost` with a hashed store: OpenSSH looks up `localhost`, finds the pinned key and refuses
    the attacker's key as changed; it must neither be accepted nor enrolled."""
    data = line(hashed("localhost"), keys.a.line)
    store = store_at(data)
    assert verdict(store, "LocalHost", 22, keys.a) == "known"
    for mode in TrustMode:
        assert verdict(store, "LocalHost", 22, keys.b, mode) == "changed"
    assert store.path.read_bytes() == data
    assert verdict(store_at(line(hashed("LocalHost"), keys.a.line)), "LocalHost", 22, keys.a) == "unknown"


def test_case_folds_ascii_letters_only(keys: Keys, store_at: StoreAt) -> None:
    assert verdict(store_at(line("GPU1.Fleet", keys.a.line)), "gpu1.FLEET", 22, keys.a) == "known"
    store = store_at(line("CAF\u00c9".encode(), keys.a.line))  # É does not fold to é in OpenSSH
    assert verdict(store, "caf\u00e9", 22, keys.a) == "unknown"
    assert verdict(store, "caf\u00c9", 22, keys.a) == "known"


def test_an_enrolment_writes_the_name_in_lower_case(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(b"")
    assert verdict(store, "GPU1", 2222, keys.a, NEW) == "added"
    assert store.path.read_bytes() == line("[gpu1]:2222", keys.a.line)


# ----------------------------------------------------------------------------------------- HostKeyAlias


def test_an_alias_is_the_only_name_looked_up_in_lower_case_and_without_the_port(keys: Keys, store_at: StoreAt) -> None:
    assert verdict(store_at(line(hashed("myalias"), keys.a.line)), "10.0.0.5", 22, keys.a, alias="MyAlias") == "known"
    assert verdict(store_at(line("myalias", keys.a.line)), "10.0.0.5", 2222, keys.a, alias="myalias") == "known"
    assert verdict(store_at(line("[myalias]:2222", keys.a.line)), "h", 2222, keys.a, alias="myalias") == "unknown"
    # the alias is pinned to a; discovery must not enrol b under the address instead
    store = store_at(line("myalias", keys.a.line))
    for mode in TrustMode:
        assert verdict(store, "10.0.0.5", 22, keys.b, mode, alias="myalias") == "changed"
    store = store_at(line("10.0.0.5", keys.a.line))
    assert verdict(store, "10.0.0.5", 22, keys.a, alias="myalias") == "unknown"
    assert store.keys_for("10.0.0.5", 22, alias="myalias") == []
    assert verdict(store, "10.0.0.5", 2222, keys.a, NEW, alias="MyAlias") == "added"
    assert store.path.read_bytes().endswith(line("myalias", keys.a.line))
    assert known_hosts_name("10.0.0.5", 2222, "MyAlias") == "myalias"


def test_a_staged_alias_enrolment_keeps_its_name(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(b"", staged=True)
    store.verify("node-1", "10.0.0.5", 2222, host_key(keys.a), NEW, alias="gpu1-key")
    [entry] = store.staged_entries()
    assert entry.alias == "gpu1-key"
    assert entry.name_sha256 == StagedKey("other", False, "elsewhere", 1, "t", "b", "GPU1-key").name_sha256
    assert store.commit() == [host_key(keys.a).fingerprint]
    assert store.path.read_bytes() == line("gpu1-key", keys.a.line)


# ------------------------------------------------------------------------------------------ [host]:port


def test_a_bracketed_name_matches_its_own_port_only(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(line("[10.0.0.5]:2222", keys.a.line))
    assert verdict(store, "10.0.0.5", 2222, keys.a) == "known"
    assert verdict(store, "10.0.0.5", 2200, keys.a) == "unknown"
    assert verdict(store, "10.0.0.5", 22, keys.a) == "unknown"
    assert verdict(store_at(line("[10.0.0.5]:22", keys.a.line)), "10.0.0.5", 22, keys.a) == "unknown"
    assert verdict(store_at(line("[10.0.0.5]:*", keys.a.line)), "10.0.0.5", 2200, keys.a) == "known"
    ipv6 = store_at(line("[fd00::5]:2222", keys.a.line) + line("FD00::6", keys.b.line))
    assert verdict(ipv6, "fd00::5", 2222, keys.a) == "known"
    assert verdict(ipv6, "fd00::6", 22, keys.b) == "known"
    assert verdict(ipv6, "fd00::6", 2222, keys.b) == "known"


def test_a_port_with_no_entry_of_its_own_accepts_the_plain_names_key_only(keys: Keys, store_at: StoreAt) -> None:
    """OpenSSH's "checking without port identifier": the port-22 line vouches for a matching key only; another
    key there is not a change for the other port, so accept-new enrols it under [host]:port."""
    store = store_at(line("10.0.0.5", keys.a.line))
    assert verdict(store, "10.0.0.5", 2222, keys.a) == "known"
    assert store.fingerprints("10.0.0.5", 2222) == [host_key(keys.a).fingerprint]
    assert verdict(store, "10.0.0.5", 2222, keys.b) == "unknown"
    assert verdict(store, "10.0.0.5", 2222, keys.b, NEW) == "added"
    assert store.keys_for("10.0.0.5", 2222) == [host_key(keys.b)]
    assert verdict(store, "10.0.0.5", 2222, keys.a) == "changed", "the port's own entry now decides"
    revoked = store_at(line("10.0.0.5", keys.a.line) + line("@revoked 10.0.0.5", keys.a.line))
    for mode in TrustMode:
        assert verdict(revoked, "10.0.0.5", 2222, keys.a, mode) == "revoked"


# ------------------------------------------------------------------------------------------------ patterns


@pytest.mark.parametrize(
    ("patterns", "host", "expected"),
    [("*.fleet,!bad.fleet", "gpu1.fleet", "known"), ("*.fleet,!bad.fleet", "bad.fleet", "unknown"),
     ("!other", "gpu1", "unknown"), ("gpu?", "gpu1", "known"), ("gpu?", "gpu12", "unknown"),
     ("gpu[1]", "gpu1", "unknown"), ("other,,gpu1", "gpu1", "known"), ("a" * 1022 + ",gpu1", "gpu1", "known"),
     ("a" * 1023 + ",gpu1", "gpu1", "unknown"), ("!" + "a" * 1023 + ",gpu1", "gpu1", "unknown"),
     ("gpu1\u00a0", "gpu1", "unknown"), ("*", "anything", "known")],
)  # fmt: skip
def test_pattern_lists(keys: Keys, store_at: StoreAt, patterns: str, host: str, expected: str) -> None:
    assert verdict(store_at(line(patterns.encode(), keys.a.line)), host, 22, keys.a) == expected


def test_hashed_names(keys: Keys, store_at: StoreAt) -> None:
    salt = os.urandom(20)
    good = hashed("gpu1", salt)
    assert verdict(store_at(line(good, keys.a.line)), "gpu1", 22, keys.a) == "known"
    assert verdict(store_at(line(hashed("[gpu1]:2222"), keys.a.line)), "gpu1", 2222, keys.a) == "known"
    assert verdict(store_at(line(good + b",other", keys.a.line)), "gpu1", 22, keys.a) == "unknown"
    assert verdict(store_at(line(good.rstrip(b"="), keys.a.line)), "gpu1", 22, keys.a) == "unknown"
    assert verdict(store_at(line(good.replace(b"|1|", b"|1|\r"), keys.a.line)), "gpu1", 22, keys.a) == "unknown"


# --------------------------------------------------------------------------------------- bytes and lines


@pytest.mark.parametrize("separator", [b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x85", b"\r", b"\v",
                                       "\u2028".encode(), "\u2029".encode()])  # fmt: skip
def test_only_newline_ends_a_line(keys: Keys, store_at: StoreAt, separator: bytes) -> None:
    """A comment holding a byte Python's splitlines breaks on, then a host entry: still one comment line."""
    store = store_at(b"# note" + separator + line("gpu1", keys.b.line) + line("gpu2", keys.a.line))
    assert verdict(store, "gpu1", 22, keys.b) == "unknown"
    assert verdict(store, "gpu2", 22, keys.a) == "known"


def test_a_line_ends_at_its_first_nul_and_crlf_lines_still_parse(keys: Keys, store_at: StoreAt) -> None:
    assert verdict(store_at(line("gpu1", keys.a.line + b"\0garbage")), "gpu1", 22, keys.a) == "known"
    assert verdict(store_at(line("gpu\0" + "1", keys.a.line)), "gpu1", 22, keys.a) == "unknown"
    assert verdict(store_at(line("gpu1", keys.a.line)[:-1] + b"\r\n"), "gpu1", 22, keys.a) == "known"
    assert verdict(store_at(b"\t gpu1\t" + keys.a.line.replace(b" ", b"\t") + b"\n"), "gpu1", 22, keys.a) == "known"


def test_non_utf8_bytes_are_only_bytes(keys: Keys, store_at: StoreAt) -> None:
    data = b"# caf\xe9\n" + line("gpu1", keys.a.line, b"comment \xff") + line(b"caf\xe9,gpu2", keys.b.line)
    store = store_at(data)
    assert verdict(store, "gpu1", 22, keys.a) == "known"
    assert verdict(store, "gpu2", 22, keys.b) == "known"
    assert verdict(store, "caf\udce9", 22, keys.b) == "known"  # the host name bytes, whatever they decode to


def test_lines_openssh_ignores_are_ignored_with_a_warning_naming_the_line(keys: Keys, tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_bytes(
        line("gpu1 ssh-ed25519 AAAA!!!")  # undecodable base64
        + line("gpu1", keys.a.key_type, "\xff".encode("latin-1"))  # a non-UTF-8 byte as the key
        + line("gpu1 ssh-rsa", keys.a.blob)  # type and key disagree
        + line("gpu1 ED25519", keys.a.blob)  # short names are not key types
        + line("gpu1")  # no key
        + line("@bogus gpu1", keys.a.line)
        + line("|2|abc|def", keys.a.line)
        + line("gpu2", keys.b.line)
    )
    store = KnownHostsStore(path)
    with pytest.warns(KnownHostsLineIgnored) as caught, pytest.raises(HostKeyUnknown):
        store.verify("node-1", "gpu1", 22, host_key(keys.a), STRICT)
    messages = {str(w.message) for w in caught}
    for number in range(1, 8):
        assert any(f"{path} line {number}: ignored, as OpenSSH ignores it" in m for m in messages), number
    assert all("AAAA" not in m and keys.a.blob not in m for m in messages), "no line content in a warning"
    with pytest.warns(KnownHostsLineIgnored):
        assert store.verify("node-2", "gpu2", 22, host_key(keys.b), STRICT).outcome == "known"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=80) | st.sampled_from([b"@revoked", b"@cert-authority", b"|1|", b"*", b"!"]),
                max_size=12))  # fmt: skip
def test_any_bytes_are_read_without_an_exception_other_than_a_refusal(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes]
) -> None:
    key = HostKey("ssh-ed25519", base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + b"k" * 32).decode())
    path = tmp_path_factory.getbasetemp() / "fuzzed_known_hosts"
    path.write_bytes(b"\n".join(part + b" ssh-ed25519 " + key.blob_b64.encode() for part in lines))
    store = KnownHostsStore(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KnownHostsLineIgnored)
        for host in ("gpu1", "[gpu1]:2222", "*", "|1|"):
            with contextlib.suppress(HostKeyError):
                store.verify("h", host, 2222, key, STRICT)
            store.keys_for(host, 22)
            store.key_blobs()


# --------------------------------------------------------------------------------------------------- keys


def test_a_key_type_field_may_name_a_signature_algorithm(keys: Keys, store_at: StoreAt) -> None:
    for name in ("rsa-sha2-256", "rsa-sha2-512", "ssh-rsa"):
        store = store_at(line("gpu1", name, keys.rsa.blob))
        assert verdict(store, "gpu1", 22, keys.rsa) == "known"
        assert store.keys_for("gpu1", 22) == [host_key(keys.rsa)], "recorded keys come back in OpenSSH's spelling"


def test_a_key_of_another_type_is_a_change(keys: Keys, store_at: StoreAt) -> None:
    assert verdict(store_at(line("gpu1", keys.rsa.line)), "gpu1", 22, keys.a) == "changed"


def test_key_blobs_are_compared_as_keys_not_as_text(keys: Keys, store_at: StoreAt) -> None:
    """A blob with whitespace inside the base64, or an RSA number with a leading zero byte, is the same key."""
    spaced = keys.a.blob[:8] + "\r" + keys.a.blob[8:]
    assert verdict(store_at(line("gpu1", keys.a.key_type, spaced)), "gpu1", 22, keys.a) == "known"
    raw = base64.b64decode(keys.rsa.blob)
    e_len = int.from_bytes(raw[11:15], "big")
    exponent = raw[15 : 15 + e_len]
    padded = raw[:11] + (e_len + 1).to_bytes(4, "big") + b"\0" + exponent + raw[15 + e_len :]
    store = store_at(line("gpu1 ssh-rsa", base64.b64encode(padded)))
    assert verdict(store, "gpu1", 22, keys.rsa) == "known"
    assert store.fingerprints("gpu1", 22) == [host_key(keys.rsa).fingerprint]


def test_keys_openssh_rejects(keys: Keys) -> None:
    def string(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    short_modulus = b"\0" + ((1 << 1022) | 1).to_bytes(128, "big")
    with pytest.raises(KeyProblem, match="shorter than 1024"):
        parse_blob(string(b"ssh-rsa") + string(b"\x01\x00\x01") + string(short_modulus))
    with pytest.raises(KeyProblem, match="negative"):
        parse_blob(string(b"ssh-rsa") + string(b"\x81") + string(short_modulus))
    with pytest.raises(KeyProblem, match="trailing bytes"):
        parse_blob(base64.b64decode(keys.a.blob) + b"\0")
    with pytest.raises(KeyProblem, match="wrong length"):
        parse_blob(string(b"ssh-ed25519") + string(b"k" * 31))
    assert parse_blob(string(b"ED25519") + string(b"k" * 32)).name == "ssh-ed25519", "a short name inside a blob"


def test_fingerprints_are_ssh_keygens(keys: Keys) -> None:
    for key in (keys.a, keys.rsa, keys.cert):
        listed = subprocess.run(["ssh-keygen", "-lf", str(key.public)], capture_output=True, text=True, check=True)
        assert host_key(key).fingerprint == listed.stdout.split()[1]


# ------------------------------------------------------------------------------------------------ @revoked


def test_a_revoked_key_is_refused_in_every_spelling_and_mode(keys: Keys, store_at: StoreAt) -> None:
    rsa_as_sha2 = line("@revoked gpu1 rsa-sha2-512", keys.rsa.blob)
    for data, key in [(line("gpu1", keys.rsa.line) + rsa_as_sha2, keys.rsa),
                      (line("gpu1", keys.a.line) + line("@revoked other,\u00a0,gpu1".encode(), keys.a.line), keys.a),
                      (line("gpu1", keys.a.line) + line("@revoked *", keys.a.line), keys.a),
                      (line("@revoked gpu1", keys.cert.line) + line("gpu1", keys.a.line), keys.a),
                      (line("@revoked \t gpu1", keys.a.line), keys.a)]:  # fmt: skip
        store = store_at(data)
        for mode in TrustMode:
            assert verdict(store, "gpu1", 22, key, mode) == "revoked", data
        assert store.path.read_bytes() == data
    assert verdict(store_at(line("gpu1", keys.a.line) + line("@revoked other", keys.a.line)), "gpu1", 22, keys.a) == (
        "known"
    )


def test_a_revoked_ca_revokes_its_certificates(keys: Keys, store_at: StoreAt) -> None:
    ca = keys.ca.line
    store = store_at(line("@revoked *", ca) + line("gpu1", keys.a.line) + line("@cert-authority *", ca))
    for mode in TrustMode:
        assert verdict(store, "gpu1", 22, keys.cert, mode) == "revoked"
    assert verdict(store, "gpu1", 22, keys.a) == "known", "the plain key is not signed by anything"


# -------------------------------------------------------------------------------------------- certificates


def test_a_host_certificate_signed_by_a_trusted_ca_is_accepted_for_its_names(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(line("@cert-authority *.fleet,gpu1,10.0.0.5", keys.ca.line))
    assert verdict(store, "gpu1", 22, keys.cert) == "known"
    assert verdict(store, "GPU1", 2222, keys.cert) == "known"
    assert verdict(store, "10.0.0.5", 22, keys.cert) == "known"
    assert verdict(store, "gpu2.fleet", 22, keys.anyname) == "known", "no principals: valid for any name"
    assert verdict(store, "other", 22, keys.cert, alias="gpu1") == "known", "an alias is the principal checked"
    assert store.path.read_bytes() == line("@cert-authority *.fleet,gpu1,10.0.0.5", keys.ca.line)


@pytest.mark.parametrize(("which", "host", "reason"), [("expired", "gpu1", "expired"), ("cert", "gpu2.fleet",
                         "not a listed principal"), ("user_cert", "gpu1", "not a host certificate")])  # fmt: skip
def test_an_invalid_certificate_falls_back_to_its_plain_key(keys: Keys, store_at: StoreAt, which: str, host: str,
                                                          reason: str) -> None:  # fmt: skip
    cert = getattr(keys, which)
    store = store_at(line("@cert-authority *", keys.ca.line))
    for mode in TrustMode:
        with pytest.raises(HostKeyUnknown, match=f"line 1 trusts a certificate authority.*{reason}"):
            store.verify("node-1", host, 22, host_key(cert), mode)
    assert store.path.read_bytes() == line("@cert-authority *", keys.ca.line), "a CA-trusted name is not enrolled"
    pinned = store_at(line("@cert-authority *", keys.ca.line) + line(host, keys.a.line))
    assert verdict(pinned, host, 22, cert) == "known"
    assert verdict(store_at(line(host, keys.b.line)), host, 22, cert) == "changed"


def test_a_ca_trusted_host_presenting_its_plain_key_is_refused_saying_why(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(b"# fleet CA\n" + line("@cert-authority *.fleet", keys.ca.line))
    for mode in TrustMode:
        with pytest.raises(HostKeyUnknown, match=r"line 2 trusts a certificate authority .* no certificate signed by"):
            store.verify("node-1", "gpu1.fleet", 22, host_key(keys.a), mode)
    assert verdict(store, "gpu1.other", 22, keys.a, NEW) == "added"


def test_a_certificate_on_a_plain_line_is_another_key(keys: Keys, store_at: StoreAt) -> None:
    """OpenSSH checks a presented certificate against @cert-authority lines only, then its plain key against
    the keys: the very certificate on a plain line pins nothing."""
    store = store_at(line("gpu1", keys.cert.line))
    assert verdict(store, "gpu1", 22, keys.a) == "changed"
    assert verdict(store, "gpu1", 22, keys.cert) == "changed"


def test_a_certificate_whose_signature_does_not_verify_is_not_a_key(keys: Keys, store_at: StoreAt) -> None:
    blob = bytearray(base64.b64decode(keys.cert.blob))
    blob[-1] ^= 1
    tampered = HostKey(keys.cert.key_type, base64.b64encode(bytes(blob)).decode())
    store = store_at(line("@cert-authority *", keys.ca.line))
    with pytest.raises(HostKeyError, match="does not parse \\(certificate signature does not verify\\)"):
        store.verify("node-1", "gpu1", 22, tampered, STRICT)


# -------------------------------------------------------------------------------------------------- writes


def test_appending_to_a_store_without_a_final_newline_never_joins_lines(keys: Keys, store_at: StoreAt) -> None:
    original = b"# caf\xe9\n" + line("other", keys.b.line)[:-1]
    store = store_at(original)
    assert verdict(store, "gpu1", 22, keys.a, NEW) == "added"
    assert store.path.read_bytes() == original + b"\n" + line("gpu1", keys.a.line)
    assert verdict(store, "other", 22, keys.b) == "known"
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"


def test_a_commit_writes_every_staged_key_or_none(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(line("keep", keys.c.line)[:-1], staged=True)
    assert verdict(store, "gpu1", 22, keys.a, NEW) == "added"
    assert verdict(store, "gpu2", 22, keys.b, NEW) == "added"
    before = store.path.read_bytes()
    store.path.write_bytes(before + b"\n" + line("gpu2", keys.c.line))  # another writer pinned gpu2 meanwhile
    with pytest.raises(HostKeyChanged):
        store.commit()
    assert store.path.read_bytes() == before + b"\n" + line("gpu2", keys.c.line), "nothing of the batch written"
    store.path.write_bytes(before)
    assert store.commit() == [host_key(keys.a).fingerprint, host_key(keys.b).fingerprint]
    assert store.path.read_bytes() == before + b"\n" + line("gpu1", keys.a.line) + line("gpu2", keys.b.line)


def test_an_enrolment_waits_for_the_writer_lock(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(b"")
    done = threading.Event()
    with store.locked():
        worker = threading.Thread(target=lambda: (verdict(store, "gpu1", 22, keys.a, NEW), done.set()))
        worker.start()
        assert not done.wait(0.3), "the append did not wait for the lock"
        assert store.path.read_bytes() == b""
    worker.join(10)
    assert done.is_set() and store.path.read_bytes() == line("gpu1", keys.a.line)


def test_content_with_keeps_every_byte_and_adds_a_final_newline(keys: Keys, store_at: StoreAt) -> None:
    original = b"# \xff\xfe not UTF-8\n" + line("other", keys.b.line)[:-1]
    store = store_at(original)
    entries = [StagedKey("node-1", False, "GPU1", 22, "ssh-ed25519", keys.a.blob),
               StagedKey("node-1", False, "gpu1", 22, "ssh-ed25519", keys.a.blob),
               StagedKey("node-2", False, "other", 22, "ssh-ed25519", keys.b.blob)]  # fmt: skip
    assert store.content_with(entries) == original + b"\n" + line("gpu1", keys.a.line)
    conflicting = [*entries, StagedKey("node-3", False, "gpu1", 22, "ssh-ed25519", keys.c.blob)]
    with pytest.raises(HostKeyChanged):
        store.content_with(conflicting)
    with pytest.raises(HostKeyUnknown, match="cannot be recorded"):
        store.content_with([StagedKey("node-4", False, "a b,*", 22, "ssh-ed25519", keys.c.blob)])


def test_trust_replaces_only_this_names_own_lines_atomically(keys: Keys, store_at: StoreAt) -> None:
    original = (b"# keep \xe9\n" + line(hashed("gpu1"), keys.a.line) + line("@revoked gpu1", keys.c.line)
                + line("GPU1", keys.a.line) + line("gpu2", keys.b.line)[:-1])  # fmt: skip
    store = store_at(original)
    inode = store.path.stat().st_ino
    with pytest.raises(HostKeyChanged, match="nothing changed"):
        store.replace("node-1", "gpu1", 22, host_key(keys.b), host_key(keys.a).fingerprint)
    assert store.path.read_bytes() == original
    store.replace("node-1", "gpu1", 22, host_key(keys.b), host_key(keys.b).fingerprint)
    assert store.path.read_bytes() == (b"# keep \xe9\n" + line("@revoked gpu1", keys.c.line) + line("gpu2", keys.b.line)
                                       + line("gpu1", keys.b.line))  # fmt: skip
    assert store.path.stat().st_ino != inode, "replaced by rename, not rewritten in place"
    assert verdict(store, "gpu1", 22, keys.b) == "known"
    with pytest.raises(HostKeyRevoked):
        store.replace("node-1", "gpu1", 22, host_key(keys.c), host_key(keys.c).fingerprint)


def test_trust_does_not_split_a_line_shared_with_other_names(keys: Keys, store_at: StoreAt) -> None:
    original = line("gpu1,gpu2", keys.a.line)
    store = store_at(original)
    with pytest.raises(HostKeyChanged, match="line 1 pins this name together with other names"):
        store.replace("node-1", "gpu1", 22, host_key(keys.b), host_key(keys.b).fingerprint)
    assert store.path.read_bytes() == original
    store.replace("node-1", "gpu1", 22, host_key(keys.a), host_key(keys.a).fingerprint)
    assert store.path.read_bytes() == original, "the shared line already pins this key"


# ------------------------------------------------------------------------------- host-key algorithm order

OPENSSH_ORDER = ["ssh-ed25519-cert-v01@openssh.com", "ecdsa-sha2-nistp256-cert-v01@openssh.com",
                 "rsa-sha2-512-cert-v01@openssh.com", "ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512"]  # fmt: skip


def test_host_key_algorithms_are_ordered_as_openssh_orders_them(keys: Keys, store_at: StoreAt) -> None:
    """order_hostkeyalgs: as offered when the first one's key type is recorded, else the algorithms of
    recorded key types (and every certificate one under a matching @cert-authority) first."""
    assert store_at(line("gpu1", keys.a.line)).host_key_algorithms("gpu1", 22, OPENSSH_ORDER) == OPENSSH_ORDER
    assert store_at(b"").host_key_algorithms("gpu1", 22, OPENSSH_ORDER) == OPENSSH_ORDER
    assert store_at(line("gpu1", keys.rsa.line)).host_key_algorithms("GPU1", 22, OPENSSH_ORDER) == [
        "rsa-sha2-512-cert-v01@openssh.com", "rsa-sha2-512", "ssh-ed25519-cert-v01@openssh.com",
        "ecdsa-sha2-nistp256-cert-v01@openssh.com", "ssh-ed25519", "ecdsa-sha2-nistp256"]  # fmt: skip
    certificates = ["ssh-ed25519-cert-v01@openssh.com", "rsa-sha2-512-cert-v01@openssh.com"]
    plain_first = ["ssh-ed25519", "rsa-sha2-512", *certificates]
    store = store_at(line("@cert-authority *", keys.ca.line) + line("other", keys.rsa.line))
    assert store.host_key_algorithms("gpu1", 2222, plain_first) == [*certificates, "ssh-ed25519", "rsa-sha2-512"]
    assert store.host_key_algorithms("other", 22, plain_first, alias="x") == [*certificates, *plain_first[:2]]


def test_a_changed_key_under_a_ca_says_no_certificate_was_presented(keys: Keys, store_at: StoreAt) -> None:
    store = store_at(line("@cert-authority gpu1", keys.ca.line) + line("gpu1", keys.b.line))
    with pytest.raises(HostKeyChanged, match=r"HOST KEY CHANGED: .*line 1 trusts a certificate authority .* no cert"):
        store.verify("node-1", "gpu1", 22, host_key(keys.a), STRICT)
    assert verdict(store, "gpu1", 22, keys.cert) == "known"


def keypair(tmp_path: Path, name: str) -> HostKey:
    """A fresh ed25519 key in `tmp_path`, as the transport presents it."""
    return host_key(make_key(tmp_path, name))


def test_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    key = keypair(tmp_path, "k")
    listed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True)
    assert fingerprint_of(base64.b64decode(key.blob_b64)) == listed.stdout.split()[1]


def test_lookup_honours_hashed_bracketed_wildcard_negated_and_revoked_entries(tmp_path: Path) -> None:
    a, b, c, d = (keypair(tmp_path, n) for n in "abcd")
    store_path = tmp_path / "known_hosts"
    store_path.write_text(
        "# a comment that must survive\n"
        f"{hashed('[10.0.0.5]:2222').decode()} {a.key_type} {a.blob_b64}\n"
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
    original = f"# keep me\n{hashed('other').decode()} {b.key_type} {b.blob_b64}"  # no trailing newline
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
    h1 = hashed("h1").decode()
    store_path.write_text(f"# c\n{h1} {a.key_type} {a.blob_b64}\nh2 {other.key_type} {other.blob_b64}\n")
    store = KnownHostsStore(store_path)
    before = store_path.read_bytes()
    with pytest.raises(HostKeyChanged, match="nothing changed"):
        store.replace("node-1", "h1", 22, b, a.fingerprint)
    assert store_path.read_bytes() == before
    store.replace("node-1", "h1", 22, b, b.fingerprint)
    assert store_path.read_text() == f"# c\nh2 {other.key_type} {other.blob_b64}\nh1 {b.key_type} {b.blob_b64}\n"


def test_host_pattern() -> None:
    assert host_pattern("h", 22) == "h" and host_pattern("h", 2222) == "[h]:2222"


def test_a_key_listed_plainly_and_as_revoked_is_refused_on_every_path(tmp_path: Path) -> None:
    a, b = keypair(tmp_path, "a"), keypair(tmp_path, "b")
    store_path = tmp_path / "known_hosts"
    for plain in ("h1", hashed("h1").decode()):
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

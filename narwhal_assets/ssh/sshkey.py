"""SSH public keys and host certificates, read as OpenSSH 9.2 reads them from a known-hosts line.

A line's key is `<type> <base64 blob>`: the type must be one of OpenSSH's key or signature names exactly
(`rsa-sha2-512` names an RSA key), the base64 is decoded as OpenSSH's `b64_pton` does (whitespace inside
skipped, padding required, no stray bits), and the blob must parse completely and be of that type (an
RSA modulus of at least 1024 bits, an ECDSA point on its curve, a certificate signed by its CA). Anything
else makes OpenSSH ignore the line, so `KeyProblem` says why and the caller ignores it too.

Two keys are the same when OpenSSH's `sshkey_equal` says so: the same kind (a certificate is not its plain
key) and the same public numbers, whatever the spelling of the blob; `same_public` ignores the certificate,
as revocation does.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass

RSA_MIN_BITS = 1024  # SSH_RSA_MINIMUM_MODULUS_SIZE
MAX_BIGNUM_BYTES = 16384 // 8  # SSHBUF_MAX_BIGNUM
MAX_EC_POINT_BYTES = 528 * 2 // 8 + 1  # SSHBUF_MAX_ECPOINT
MAX_PRINCIPALS = 256  # SSHKEY_CERT_MAX_PRINCIPALS
HOST_CERTIFICATE = 2  # SSH2_CERT_TYPE_HOST (1 is a user certificate)
CERT_SUFFIX = "-cert-v01@openssh.com"
# OpenSSH 9.2's default CASignatureAlgorithms: what may sign a host certificate (not SHA-1 RSA, not DSA).
CA_SIGNATURE_ALGORITHMS = frozenset({
    "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com", "rsa-sha2-512", "rsa-sha2-256",
})  # fmt: skip
# The order of each NIST curve's group (`openssl ecparam -param_enc explicit -text`), for the range checks
# of OpenSSH's sshkey_ec_validate_public.
CURVE_ORDERS = {
    "nistp256": int("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551", 16),
    "nistp384": int("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"
                    "C7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973", 16),
    "nistp521": int("01FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"
                    "FA51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16),
}  # fmt: skip


@dataclass(frozen=True)
class _Kind:
    """What a key name stands for: the key's kind, whether it is a certificate, its curve (ECDSA)."""

    kind: str
    cert: bool = False
    curve: str | None = None

    @property
    def plain_name(self) -> str:
        """The name OpenSSH writes for the plain key of this kind (sshkey_ssh_name)."""
        return PLAIN_NAMES[(self.kind, self.curve)]


def _cert_name(plain: str) -> str:
    return plain.removesuffix("@openssh.com") + CERT_SUFFIX


PLAIN_NAMES = {
    ("rsa", None): "ssh-rsa",
    ("dsa", None): "ssh-dss",
    ("ed25519", None): "ssh-ed25519",
    ("sk-ed25519", None): "sk-ssh-ed25519@openssh.com",
    ("ecdsa", "nistp256"): "ecdsa-sha2-nistp256",
    ("ecdsa", "nistp384"): "ecdsa-sha2-nistp384",
    ("ecdsa", "nistp521"): "ecdsa-sha2-nistp521",
    ("sk-ecdsa", "nistp256"): "sk-ecdsa-sha2-nistp256@openssh.com",
}
# Every name OpenSSH 9.2 accepts in a line's key-type field (`ssh -Q key-sig`): each plain name, its
# certificate name, and the signature names that denote a key of that kind.
KEY_NAMES: dict[str, _Kind] = {
    **{name: _Kind(kind, False, curve) for (kind, curve), name in PLAIN_NAMES.items()},
    **{_cert_name(name): _Kind(kind, True, curve) for (kind, curve), name in PLAIN_NAMES.items()},
    "rsa-sha2-256": _Kind("rsa"),
    "rsa-sha2-512": _Kind("rsa"),
    "rsa-sha2-256" + CERT_SUFFIX: _Kind("rsa", True),
    "rsa-sha2-512" + CERT_SUFFIX: _Kind("rsa", True),
    "webauthn-sk-ecdsa-sha2-nistp256@openssh.com": _Kind("sk-ecdsa", False, "nistp256"),
}
# Inside a blob, OpenSSH also takes a plain kind's short name, in any case (sshkey_type_from_name); the
# ECDSA ones name no curve and so never parse.
SHORT_NAMES = {"rsa": _Kind("rsa"), "dsa": _Kind("dsa"), "ed25519": _Kind("ed25519"),
               "ed25519-sk": _Kind("sk-ed25519")}  # fmt: skip
BASE64_SPACE = b" \t\n\v\f\r"  # what b64_pton skips (C isspace)


class KeyProblem(ValueError):
    """Why OpenSSH would not accept this key (a fixed phrase: never any of the key's own bytes)."""


@dataclass(frozen=True)
class Certificate:
    """The parts of an OpenSSH certificate that decide whether it vouches for a host."""

    cert_type: int
    principals: tuple[bytes, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    signature_key: PublicKey
    signature_type: str

    def host_problem(self, name: bytes, now: float | None = None) -> str | None:
        """Why this certificate does not vouch for host `name` now (sshkey_cert_check_host), or None."""
        moment = int(time.time() if now is None else now)
        if self.cert_type != HOST_CERTIFICATE:
            return "not a host certificate"
        if moment < self.valid_after:
            return "not yet valid"
        if moment >= self.valid_before:
            return "expired"
        if self.principals and name not in self.principals:
            return "the name is not a listed principal"
        if self.critical_options:
            return "it has critical options"
        if self.signature_type not in CA_SIGNATURE_ALGORITHMS:
            return "signed with an algorithm OpenSSH does not accept for a CA (CASignatureAlgorithms)"
        return None


@dataclass(frozen=True)
class PublicKey:
    """One parsed key: `plain` is the canonical blob of its public key (what equality and fingerprints use),
    `blob` the blob as given (for a certificate, the whole certificate)."""

    name: str
    plain: bytes
    blob: bytes
    certificate: Certificate | None = None

    @property
    def plain_name(self) -> str:
        return KEY_NAMES[self.name].plain_name

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the plain key, for a certificate too (as `ssh-keygen -l` shows it)."""
        return fingerprint_of(self.plain)

    def equals(self, other: PublicKey) -> bool:
        """sshkey_equal: a certificate equals only the same certificate, a plain key only the same plain key."""
        if self.certificate is not None or other.certificate is not None:
            return self.certificate is not None and other.certificate is not None and self.blob == other.blob
        return self.plain == other.plain

    def same_public(self, other: PublicKey) -> bool:
        """sshkey_equal_public: the same public key, certificate or not."""
        return self.plain == other.plain


def fingerprint_of(blob: bytes) -> str:
    """OpenSSH's `SHA256:<unpadded base64>` fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def b64_pton(text: bytes) -> bytes:
    """Decode base64 as OpenSSH's b64_pton: whitespace anywhere is skipped, padding is required, the bits
    past the last byte must be zero (so only the canonical spelling, once the whitespace is gone, decodes)."""
    compact = text.translate(None, BASE64_SPACE)
    try:
        decoded = base64.b64decode(compact, validate=True)
    except ValueError:
        raise KeyProblem("the key is not valid base64") from None
    if base64.b64encode(decoded) != compact:
        raise KeyProblem("the key is not valid base64") from None
    return decoded


def read_key(field: bytes) -> PublicKey:
    """The key at the start of `field` (`<type> <blob>[ <comment>]`, leading blanks skipped), as sshkey_read."""
    field = field.lstrip(b" \t")
    type_end = _blank(field)
    if type_end == len(field):
        raise KeyProblem("nothing after the key type")
    kind = KEY_NAMES.get(field[:type_end].decode("ascii", "replace"))
    if kind is None:
        raise KeyProblem("unknown key type")
    rest = field[type_end:].lstrip(b" \t")
    if not rest:
        raise KeyProblem("no key after the key type")
    key = parse_blob(b64_pton(rest[: _blank(rest)]))
    parsed = KEY_NAMES[key.name]
    if (parsed.kind, parsed.cert) != (kind.kind, kind.cert) or parsed.curve != kind.curve:
        raise KeyProblem("the key is not of the type the line names")
    return key


def parse_blob(blob: bytes, *, allow_cert: bool = True) -> PublicKey:
    """A key or certificate blob, parsed completely (sshkey_from_blob)."""
    reader = _Reader(blob)
    type_name = reader.text()
    kind = KEY_NAMES.get(type_name) or SHORT_NAMES.get(type_name.lower())
    if kind is None:
        raise KeyProblem("unknown key type in the key")
    if kind.cert and not allow_cert:
        raise KeyProblem("a certificate cannot sign a certificate")
    if kind.cert:
        reader.string()  # the nonce
    plain = _public_numbers(reader, kind)
    certificate = _certificate(reader, blob) if kind.cert else None
    if reader.left():
        raise KeyProblem("trailing bytes after the key")
    return PublicKey(type_name if kind.cert else kind.plain_name, plain, blob, certificate)


def _public_numbers(reader: _Reader, kind: _Kind) -> bytes:
    """Read the public key of `kind` and return its canonical plain blob."""
    head = _string(kind.plain_name.encode())
    if kind.kind == "rsa":
        e, n = reader.mpint(), reader.mpint()
        if n.bit_length() < RSA_MIN_BITS:
            raise KeyProblem(f"RSA key shorter than {RSA_MIN_BITS} bits")
        return head + _mpint(e) + _mpint(n)
    if kind.kind == "dsa":
        return head + b"".join(_mpint(reader.mpint()) for _ in range(4))
    if kind.kind in ("ed25519", "sk-ed25519"):
        public = reader.string()
        if len(public) != 32:
            raise KeyProblem("Ed25519 key of the wrong length")
        return head + _string(public) + (_string(reader.cstring()) if kind.kind == "sk-ed25519" else b"")
    curve = reader.string()
    if curve != (kind.curve or "").encode():
        raise KeyProblem("ECDSA key on another curve than its type names")
    point = reader.string()
    _check_point(kind.curve or "", point)
    return head + _string(curve) + _string(point) + (_string(reader.cstring()) if kind.kind == "sk-ecdsa" else b"")


def _check_point(curve: str, point: bytes) -> None:
    """An uncompressed point on the curve that passes sshkey_ec_validate_public's range checks."""
    from cryptography.hazmat.primitives.asymmetric import ec

    curves: dict[str, type[ec.SECP256R1 | ec.SECP384R1 | ec.SECP521R1]] = {
        "nistp256": ec.SECP256R1, "nistp384": ec.SECP384R1, "nistp521": ec.SECP521R1}
    if not 0 < len(point) <= MAX_EC_POINT_BYTES or point[0] != 4:
        raise KeyProblem("ECDSA point not in uncompressed form")
    try:
        numbers = ec.EllipticCurvePublicKey.from_encoded_point(curves[curve](), point).public_numbers()
    except ValueError:
        raise KeyProblem("ECDSA point not on its curve") from None
    order = CURVE_ORDERS[curve]
    half = order.bit_length() // 2
    if min(numbers.x.bit_length(), numbers.y.bit_length()) <= half or max(numbers.x, numbers.y) >= order - 1:
        raise KeyProblem("ECDSA point outside the range OpenSSH accepts")


def _certificate(reader: _Reader, blob: bytes) -> Certificate:
    """The certificate fields after the public key, with its CA's signature checked (cert_parse)."""
    reader.u64()  # serial
    cert_type = reader.u32()
    reader.cstring()  # key id
    principals = _Reader(reader.string())
    valid_after, valid_before = reader.u64(), reader.u64()
    critical, extensions = reader.string(), reader.string()
    reader.string()  # reserved
    signature_key = parse_blob(reader.string(), allow_cert=False)
    signed = blob[: reader.offset]
    signature = reader.string()
    if cert_type not in (1, HOST_CERTIFICATE):
        raise KeyProblem("unknown certificate type")
    names: list[bytes] = []
    while principals.left():
        if len(names) >= MAX_PRINCIPALS:
            raise KeyProblem("too many certificate principals")
        names.append(principals.cstring())
    for section in (_Reader(critical), _Reader(extensions)):
        while section.left():
            section.string(), section.string()
    signature_type = _Reader(signature).text()
    _check_signature(signature_key, signed, signature)
    return Certificate(cert_type, tuple(names), valid_after, valid_before, critical, signature_key, signature_type)


def _check_signature(signer: PublicKey, signed: bytes, signature: bytes) -> None:
    import paramiko

    if signer.plain_name not in ("ssh-rsa", "ssh-ed25519") and not signer.plain_name.startswith("ecdsa-"):
        raise KeyProblem("certificate signed by a DSA or security-key CA, which this tool cannot check")
    try:
        ca = paramiko.PKey.from_type_string(signer.plain_name, signer.plain)
        valid = ca.verify_ssh_sig(signed, paramiko.Message(signature))
    except (paramiko.SSHException, ValueError, TypeError, IndexError):
        valid = False
    if not valid:
        raise KeyProblem("certificate signature does not verify")


class _Reader:
    """The SSH wire format (RFC 4251): every read is bounds-checked and a short blob is a KeyProblem."""

    def __init__(self, data: bytes):
        self.data, self.offset = data, 0

    def left(self) -> int:
        return len(self.data) - self.offset

    def _take(self, size: int) -> bytes:
        if size > self.left():
            raise KeyProblem("the key is truncated")
        start, self.offset = self.offset, self.offset + size
        return self.data[start : self.offset]

    def u32(self) -> int:
        return int.from_bytes(self._take(4), "big")

    def u64(self) -> int:
        return int.from_bytes(self._take(8), "big")

    def string(self) -> bytes:
        return self._take(self.u32())

    def cstring(self) -> bytes:
        value = self.string()
        if b"\0" in value:
            raise KeyProblem("a NUL byte inside a key string")
        return value

    def text(self) -> str:
        return self.cstring().decode("ascii", "replace")

    def mpint(self) -> int:
        """A non-negative bignum, as sshbuf_get_bignum2 (leading zero bytes allowed and trimmed)."""
        raw = self.string()
        if raw and raw[0] & 0x80:
            raise KeyProblem("a negative number in the key")
        if len(raw) > MAX_BIGNUM_BYTES + 1 or (len(raw) == MAX_BIGNUM_BYTES + 1 and raw[0]):
            raise KeyProblem("a number in the key is too large")
        return int.from_bytes(raw, "big")


def _blank(data: bytes) -> int:
    """The index of the first space or tab in `data` (strcspn " \\t"), or its length."""
    space, tab = data.find(b" "), data.find(b"\t")
    found = [i for i in (space, tab) if i >= 0]
    return min(found) if found else len(data)


def _string(value: bytes) -> bytes:
    return len(value).to_bytes(4, "big") + value


def _mpint(value: int) -> bytes:
    return _string(value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b"")

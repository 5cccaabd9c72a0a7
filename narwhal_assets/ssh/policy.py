"""What the paramiko transport does with each option of an `ssh -G` answer: applied, overridden, not used, or
refused for the host.

Every option OpenSSH 9.2 prints is in one of the tables below. An option the config sets (its value differs
from OpenSSH's own default) that is not applied is listed with the reason (`not_applied`); one that would
change the connection in a way the transport cannot reproduce refuses the host, naming option and value.
Algorithm lists are applied as OpenSSH gives them (after its `+`/`-`/`^` edits), restricted to what paramiko
implements; a list with nothing paramiko implements refuses the host.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from dataclasses import dataclass

import paramiko

from narwhal_assets.ssh.resolver import Answer
from narwhal_assets.ssh.sshkey import CERT_SUFFIX

DEFAULT_AUTH_ORDER = "gssapi-with-mic,hostbased,publickey,keyboard-interactive,password"
# preferredauthentications method -> the option that enables it, as ssh -G prints it
METHOD_SWITCH = {
    "gssapi-with-mic": "gssapiauthentication",
    "hostbased": "hostbasedauthentication",
    "publickey": "pubkeyauthentication",
    "keyboard-interactive": "kbdinteractiveauthentication",
    "password": "passwordauthentication",
}
USABLE_METHODS = ("publickey", "password")

# Each option as OpenSSH spells it (ssh -G prints them lowercase) for messages and `not_applied`.
_SPELLED = """
AddKeysToAgent AddressFamily BatchMode BindAddress BindInterface CanonicalDomains CanonicalizeFallbackLocal
CanonicalizeHostname CanonicalizeMaxDots CanonicalizePermittedCNAMEs CASignatureAlgorithms CertificateFile
CheckHostIP Ciphers ClearAllForwardings Compression ConnectionAttempts ConnectTimeout ControlMaster
ControlPath ControlPersist DynamicForward EnableEscapeCommandline EnableSSHKeysign EscapeChar
ExitOnForwardFailure FingerprintHash ForkAfterAuthentication ForwardAgent ForwardX11 ForwardX11Timeout
ForwardX11Trusted GatewayPorts GlobalKnownHostsFile GSSAPIAuthentication GSSAPIClientIdentity
GSSAPIDelegateCredentials GSSAPIKexAlgorithms GSSAPIKeyExchange GSSAPIRenewalForcesRekey GSSAPIServerIdentity
GSSAPITrustDns HashKnownHosts HostbasedAcceptedAlgorithms HostbasedAuthentication HostKeyAlgorithms
HostKeyAlias HostName IdentitiesOnly IdentityAgent IdentityFile IPQoS KbdInteractiveAuthentication
KbdInteractiveDevices KexAlgorithms KnownHostsCommand LocalCommand LocalForward LogLevel LogVerbose MACs
NoHostAuthenticationForLocalhost NumberOfPasswordPrompts PasswordAuthentication PermitLocalCommand
PermitRemoteOpen PKCS11Provider Port PreferredAuthentications ProxyCommand ProxyJump ProxyUseFdpass
PubkeyAcceptedAlgorithms PubkeyAuthentication RekeyLimit RemoteCommand RemoteForward RequestTTY
RequiredRSASize RevokedHostKeys SecurityKeyProvider SendEnv ServerAliveCountMax ServerAliveInterval
SessionType SetEnv StdinNull StreamLocalBindMask StreamLocalBindUnlink StrictHostKeyChecking SyslogFacility
TCPKeepAlive Tunnel TunnelDevice UpdateHostKeys User UserKnownHostsFile VerifyHostKeyDNS VisualHostKey
XAuthLocation
"""
NAMES = {name.lower(): name for name in _SPELLED.split()}

# Read by destination.py / transport.py and applied (or, for the authentication switches, checked there).
APPLIED = frozenset({
    "host", "hostname", "port", "user", "identityfile", "identitiesonly", "identityagent", "certificatefile",
    "hostkeyalias", "proxycommand", "proxyjump", "connecttimeout", "addressfamily", "bindaddress", "ciphers",
    "kexalgorithms", "macs", "hostkeyalgorithms", "pubkeyacceptedalgorithms", "preferredauthentications",
    "pubkeyauthentication", "passwordauthentication", "compression", "tcpkeepalive", "batchmode", "canonicaldomains",
    "canonicalizefallbacklocal", "canonicalizehostname", "canonicalizemaxdots", "canonicalizepermittedcnames",
    "proxyusefdpass", "pkcs11provider", "securitykeyprovider", "bindinterface", "remotecommand", "requesttty",
    "loglevel",  # set by the resolver's own `-v`
})  # fmt: skip

HOST_KEYS = "overridden: host keys are checked against the checkout's store (NARWHAL_SSH_KNOWN_HOSTS) only"
FORWARDING = "no forwarding on these connections (`deploy-hosts tunnel` forwards with OpenSSH)"
INTERACTIVE = "a feature of interactive ssh sessions; these connections run commands only"
NOT_USED: dict[str, str] = {
    **dict.fromkeys(("stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile", "updatehostkeys",
                     "checkhostip", "hashknownhosts", "knownhostscommand", "verifyhostkeydns",
                     "nohostauthenticationforlocalhost", "revokedhostkeys", "fingerprinthash", "visualhostkey",
                     "casignaturealgorithms"), HOST_KEYS),
    **dict.fromkeys(("localforward", "remoteforward", "dynamicforward", "clearallforwardings",
                     "exitonforwardfailure", "gatewayports", "permitremoteopen", "streamlocalbindmask",
                     "streamlocalbindunlink"), FORWARDING),
    **dict.fromkeys(("escapechar", "enableescapecommandline", "stdinnull", "forkafterauthentication",
                     "sessiontype", "tunnel", "tunneldevice", "localcommand", "permitlocalcommand",
                     "xauthlocation"), INTERACTIVE),
    **dict.fromkeys(("forwardx11", "forwardx11trusted", "forwardx11timeout"), "X11 is never forwarded"),
    **dict.fromkeys(("serveraliveinterval", "serveralivecountmax"),
                    "overridden: keep-alives follow NARWHAL_SSH_ALIVE_INTERVAL and NARWHAL_SSH_ALIVE_COUNT"),
    **dict.fromkeys(("controlmaster", "controlpath", "controlpersist"),
                    "connections are not shared through OpenSSH's multiplexing (each command opens its own)"),
    **dict.fromkeys(("gssapidelegatecredentials", "gssapikeyexchange", "gssapitrustdns", "gssapirenewalforcesrekey",
                     "gssapikexalgorithms", "gssapiclientidentity", "gssapiserveridentity"),
                    "GSSAPI is not used (paramiko here has no GSSAPI)"),
    **dict.fromkeys(("hostbasedauthentication", "hostbasedacceptedalgorithms", "enablesshkeysign"),
                    "host-based authentication is not used"),
    "gssapiauthentication": "GSSAPI is not used (paramiko here has no GSSAPI); the next method in "
    "PreferredAuthentications is, as OpenSSH without a Kerberos ticket does",
    **dict.fromkeys(("syslogfacility", "logverbose"), "OpenSSH's own logging"),
    "forwardagent": "the agent is never forwarded",
    "sendenv": "no environment variables are sent",
    "setenv": "no environment variables are sent",
    "addkeystoagent": "keys are never added to the agent",
    "numberofpasswordprompts": "nothing is ever prompted for",
    **dict.fromkeys(("kbdinteractiveauthentication", "kbdinteractivedevices"),
                    "keyboard-interactive authentication is not used"),
    "connectionattempts": "one TCP connection attempt per host, bounded by the connect timeout",
    "rekeylimit": "paramiko re-keys on its own schedule",
    "ipqos": "the IP type of service is left as the system sets it",
    "requiredrsasize": "RSA key sizes are not checked (host keys are pinned in the checkout's store)",
}  # fmt: skip


@dataclass(frozen=True)
class NotApplied:
    """An option the config sets that these connections deliberately override or do not use."""

    option: str
    value: str
    reason: str


@dataclass(frozen=True)
class Refusal:
    """An option whose effect the paramiko transport cannot reproduce: the host is refused (`shell` and `tunnel`
    run OpenSSH itself, which does what it asks)."""

    option: str
    value: str
    reason: str


def option_name(key: str) -> str:
    return NAMES.get(key, key)


def not_applied(answer: Answer, defaults: Answer) -> tuple[NotApplied, ...]:
    """Every option the config sets (differs from OpenSSH's default) that is not applied."""
    found = []
    for key, values in answer.options.items():
        if key in APPLIED or values == defaults.all(key):
            continue
        reason = NOT_USED.get(key, "not used by these connections (an option this version does not know)")
        found += [NotApplied(option_name(key), value, reason) for value in values]
    return tuple(found)


def _set(answer: Answer, key: str, default: str) -> str | None:
    value = answer.one(key)
    return value if value is not None and value.lower() != default else None


REFUSALS: tuple[tuple[str, str, Callable[[Answer], str | None]], ...] = (
    ("proxyusefdpass", "a ProxyCommand that passes a connected descriptor is not supported",
     lambda a: _set(a, "proxyusefdpass", "no")),
    ("pkcs11provider", "PKCS#11 keys are not supported", lambda a: _set(a, "pkcs11provider", "none")),
    ("securitykeyprovider", "security keys (sk- keys) are not supported",
     lambda a: _set(a, "securitykeyprovider", "internal")),
    ("bindinterface", "binding to an interface is not supported", lambda a: a.one("bindinterface")),
    ("remotecommand", "commands are run by the deployment itself (OpenSSH runs it only in `deploy-hosts shell`)",
     lambda a: _set(a, "remotecommand", "none")),
    ("requesttty", "these connections run commands without a terminal",
     lambda a: a.one("requesttty") if a.one("requesttty") in ("yes", "force") else None),
)  # fmt: skip


def refusals(answer: Answer) -> list[Refusal]:
    """The options set that the paramiko transport cannot honour, and algorithm lists it cannot meet."""
    found = [Refusal(option_name(key), value, reason) for key, reason, test in REFUSALS if (value := test(answer))]
    supported = paramiko_algorithms()
    for key, have in supported.items():
        value = answer.one(key) or ""
        if not [name for name in value.split(",") if name in have]:
            found.append(Refusal(option_name(key), value, f"none of these is implemented by paramiko "
                                                           f"(it has {','.join(have)})"))  # fmt: skip
    methods = auth_methods(answer)
    if not set(methods) & set(USABLE_METHODS):
        value = answer.one("preferredauthentications") or DEFAULT_AUTH_ORDER
        shown = ",".join(methods) or "none"
        found.append(Refusal("PreferredAuthentications", value,
                             f"leaves only {shown} (with the *Authentication switches); these connections "
                             "authenticate by public key or password only (no GSSAPI, host-based or "
                             "keyboard-interactive)"))  # fmt: skip
    return found


def auth_off(answer: Answer) -> dict[str, tuple[str, str]]:
    """For each method these connections use that the config turns off: the option and value doing it."""
    order = (answer.one("preferredauthentications") or DEFAULT_AUTH_ORDER).split(",")
    found = {}
    for method in USABLE_METHODS:
        switch = answer.one(METHOD_SWITCH[method])
        if switch in ("no", "false"):
            found[method] = (option_name(METHOD_SWITCH[method]), switch)
        elif method not in order:
            found[method] = ("PreferredAuthentications", ",".join(order))
    return found


def auth_methods(answer: Answer) -> tuple[str, ...]:
    """PreferredAuthentications in order, without the methods whose switch (`PubkeyAuthentication no`...)
    turns them off."""
    order = (answer.one("preferredauthentications") or DEFAULT_AUTH_ORDER).split(",")
    return tuple(m for m in order if m in METHOD_SWITCH and answer.one(METHOD_SWITCH[m]) not in ("no", "false"))


@dataclass(frozen=True)
class Algorithms:
    """Per algorithm option, the names to offer: OpenSSH's list (after its `+`/`-`/`^` edits) restricted to
    what paramiko implements, in OpenSSH's order; `configured` holds the options the config set (their order
    is then the config's to keep; otherwise the transport may order the same names its own way)."""

    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    configured: frozenset[str] = frozenset()

    def names(self, option: str) -> tuple[str, ...] | None:
        """The names for `option` (ssh -G's lowercase name); None when nothing restricts it."""
        return dict(self.lists).get(option)


def algorithms(answer: Answer, defaults: Answer) -> Algorithms:
    lists = tuple((key, tuple(n for n in (answer.one(key) or "").split(",") if n in have))
                  for key, have in paramiko_algorithms().items())  # fmt: skip
    return Algorithms(lists, frozenset(key for key, _ in lists if answer.one(key) != defaults.one(key)))


@functools.cache
def paramiko_algorithms() -> dict[str, tuple[str, ...]]:
    """What this paramiko implements, per OpenSSH option, from a transport's public security options."""
    ours, theirs = socket.socketpair()
    try:
        transport = paramiko.Transport(ours)
        options = transport.get_security_options()
        found = {"ciphers": tuple(options.ciphers), "kexalgorithms": tuple(options.kex),
                 "macs": tuple(options.digests), "hostkeyalgorithms": tuple(options.key_types)}  # fmt: skip
        transport.close()
    finally:
        ours.close()
        theirs.close()
    keys = found["hostkeyalgorithms"]  # certificates too: paramiko verifies a host certificate's key exchange
    found["hostkeyalgorithms"] = (*(key + CERT_SUFFIX for key in keys), *keys)
    found["pubkeyacceptedalgorithms"] = (*keys, *(key + CERT_SUFFIX for key in keys))
    return found

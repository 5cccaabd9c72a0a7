"""The resolver against OpenSSH itself, on the corpus in tests/fixtures/ssh-configs/ (its README says what is
there): for every destination, OpenSSH's answer is the oracle, not our reading of the config.

Two oracles per destination, both the workstation's OpenSSH 9.2, given exactly what an operator types:
`ssh -G -F CONFIG DESTINATION` for host, port, user, HostKeyAlias, IdentitiesOnly, ConnectTimeout and
IdentityAgent; and a real `ssh -v -F CONFIG DESTINATION` whose log says which identity and certificate files
it opens (after expanding them itself) and which ProxyCommand it executes (for a ProxyJump, the command it
builds for the hop: the hop is then resolved by OpenSSH from those arguments, recursively, and compared with
our hop). That run connects nowhere: its `$SHELL` (oracle-shell.sh) runs `Match exec` commands but never a
ProxyCommand, and a destination without one gets a ProxyCommand that is never run. A destination OpenSSH
refuses (config error, bad token, jump loop) must be refused by us too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from narwhal_assets.core.errors import InputError
from narwhal_assets.ssh import resolver
from narwhal_assets.ssh.destination import Endpoint, resolve_endpoint

CORPUS = Path(__file__).parents[1] / "fixtures" / "ssh-configs"
NO_NETWORK = "narwhal-oracle-never-runs"
IDENTITY = re.compile(r"^debug1: identity file (.*) type -?\d+$")
CERTIFICATE = re.compile(r"^debug1: certificate file (.*) type -?\d+$")
EXECUTING = ("debug1: Executing proxy command: exec ", "debug1: Executing proxy dialer command: exec ")
DIALER_FAILED = "proxy dialer did not pass back a connection"  # ProxyUseFdpass: OpenSSH ran our dialer
VIS = re.compile(rb"\\([0-7]{3}|\\)")  # OpenSSH's log escapes a byte as \ooo (strnvis) and \ as \\
ENVIRONMENT = {"NARWHAL_TEST_KEYDIR": "/keys dir", "NARWHAL_TEST_KEYNAME": "ops%x", "NARWHAL_TEST_AGENT":
               "/run/agent.sock", "SSH_AUTH_SOCK": "/run/user/agent.socket"}  # fmt: skip


def corpus() -> list[tuple[str, str, str | None]]:
    """(config file name, destination, the option refusing it or None) for every destination in the corpus."""
    cases = []
    for path in sorted(CORPUS.glob("*.conf")):
        head = path.read_bytes().decode("latin-1").splitlines()
        destinations = head[0].removeprefix("# destinations:").split()
        refused = dict(item.split("=") for item in head[1].removeprefix("# refused:").split()) if \
            head[1].startswith("# refused:") else {}  # fmt: skip
        cases += [(path.name, destination, refused.get(destination)) for destination in destinations]
    return cases


@pytest.fixture(autouse=True)
def openssh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The corpus in `$HOME/.ssh` (relative Includes resolve there), the oracle's `$SHELL`, the variables the
    configs name; the same environment for OpenSSH and for us, and no answer cached from another test."""
    home = tmp_path / "home"
    shutil.copytree(CORPUS, home / ".ssh")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SHELL", str(home / ".ssh" / "oracle-shell.sh"))
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NARWHAL_TEST_UNSET_VARIABLE", raising=False)
    resolver.clear_cache()
    return home


@dataclass
class OpenSsh:
    """What OpenSSH said for one destination."""

    accepted: bool
    options: dict[str, str] = field(default_factory=dict)
    identity_files: list[str] | None = field(default_factory=list)  # None: OpenSSH got no connection to load them
    certificate_files: list[str] | None = field(default_factory=list)
    proxy_command: str | None = None  # as executed, when the config sets one (or ProxyJump builds one)


def openssh(config: Path, args: list[str]) -> OpenSsh:
    """OpenSSH's answer for `ssh -F CONFIG ARGS...`, from `ssh -G` and a real run that connects nowhere."""
    shown = subprocess.run(["ssh", "-G", "-F", str(config), *args], capture_output=True, timeout=30, check=False)
    if shown.returncode != 0:
        return OpenSsh(False)
    options: dict[str, str] = {}
    for line in shown.stdout.decode("utf-8", "surrogateescape").splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key, value)
    routed = options.get("proxycommand") or options.get("proxyjump", "none") != "none"
    inject = [] if routed else ["-o", f"ProxyCommand={NO_NETWORK}"]
    run = subprocess.run(["ssh", "-v", "-F", str(config), "-o", "BatchMode=yes", *inject, *args],
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)  # fmt: skip
    unescaped = VIS.sub(lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1), 8)]), run.stderr)
    log = unescaped.decode("utf-8", "surrogateescape").splitlines()
    dialed = DIALER_FAILED in log
    found = OpenSsh("debug1: Local version string" in "\n".join(log) or dialed, options)
    for line in log:
        if (match := IDENTITY.match(line)) and not match.group(1).endswith("-cert"):
            found.identity_files.append(match.group(1))
        elif match := CERTIFICATE.match(line):
            found.certificate_files.append(match.group(1))
        elif line.startswith(EXECUTING) and routed:
            found.proxy_command = next(line[len(p) :] for p in EXECUTING if line.startswith(p))
    if dialed:
        found.identity_files = found.certificate_files = None
    return found


def hop_arguments(command: str) -> tuple[list[str], str]:
    """The ssh arguments of the command OpenSSH runs for a ProxyJump hop (without -F and -v), and its `-W`."""
    words = shlex.split(command)
    assert words[0] == "ssh", command
    args, target, i = [], "", 1
    while i < len(words):
        word = words[i]
        if word in ("-l", "-p", "-J"):
            args += [word, words[i + 1]]
            i += 2
        elif word in ("-F", "-W"):
            target = words[i + 1] if word == "-W" else target
            i += 2
        elif word.startswith("-v"):
            i += 1
        else:
            args.append(word)
            i += 1
    return args, target


def assert_same(config: Path, args: list[str], ours: Endpoint | InputError, depth: int = 0) -> None:
    theirs = openssh(config, args)
    where = f"{config.name}: ssh {' '.join(args)}"
    if not theirs.accepted:
        assert isinstance(ours, InputError), f"{where}: OpenSSH refuses it, we resolved {ours}"
        return
    assert isinstance(ours, Endpoint), f"{where}: OpenSSH accepts it, we refused: {ours}"
    options = theirs.options
    assert (ours.host, ours.port, ours.user) == (options["hostname"], int(options["port"]), options["user"]), where
    assert ours.host_key_alias == options.get("hostkeyalias"), where
    assert ours.identities_only == (options["identitiesonly"] == "yes"), where
    assert str(ours.connect_timeout or "none") == options["connecttimeout"], where
    assert ours.identity_agent == expected_agent(options.get("identityagent")), where
    if theirs.identity_files is not None:
        assert list(ours.identity_files) == theirs.identity_files, where
        assert list(ours.certificate_files) == theirs.certificate_files, where
    if theirs.proxy_command is None:
        assert ours.proxy_command is None and ours.via is None, where
    elif options.get("proxyjump", "none") == "none":
        assert ours.via is None and ours.proxy_command == theirs.proxy_command, where
    else:
        assert ours.proxy_command is None and ours.via is not None, where
        hop_args, target = hop_arguments(theirs.proxy_command)
        assert target == f"[{ours.host}]:{ours.port}", where
        query = ours.via.query
        assert query is not None
        mine = [*(["-l", query.user] if query.user else []), *(["-p", str(query.port)] if query.port else []),
                *(["-J", query.jump] if query.jump else []), query.host]  # fmt: skip
        assert sorted(mine) == sorted(hop_args), f"{where}: hop"
        assert depth < 8
        assert_same(config, hop_args, ours.via, depth + 1)


def expected_agent(value: str | None) -> str | None:
    """The socket OpenSSH uses for an IdentityAgent value as `ssh -G` prints it (ssh.c's rules)."""
    if value is None or value == "SSH_AUTH_SOCK":
        return os.environ.get("SSH_AUTH_SOCK")
    if value == "none":
        return None
    return os.environ.get(value[1:]) if value.startswith("$") else value


@pytest.mark.parametrize(("name", "destination", "refused_by"), corpus())
def test_every_destination_resolves_to_what_openssh_resolves(
    openssh_home: Path, name: str, destination: str, refused_by: str | None
) -> None:
    config = openssh_home / ".ssh" / name
    try:
        ours: Endpoint | InputError = resolve_endpoint(destination, config)
    except InputError as exc:
        ours = exc
    assert_same(config, [destination], ours)
    if isinstance(ours, Endpoint):
        refusal = ours.refusal()
        if refused_by is None:
            assert refusal is None, f"{name} {destination}: refused: {refusal}"
        else:
            assert refusal is not None and refusal.startswith(f"{refused_by} "), refusal
            assert f"ssh config {config}" in refusal


def test_the_corpus_covers_every_construct_the_issue_lists() -> None:
    """A test that can fail when the corpus loses a construct (each is a regular expression over its text)."""
    text = "\n".join(p.read_bytes().decode("latin-1") for p in sorted(CORPUS.rglob("*.conf")))
    constructs = [
        r"ProxyJump \S+,\S+", r"start-session", r"cloudflared", r"ssh -W %h:%p", r"(?m)^ +Include ", r"(?m)^Include ",
        r"Match final", r"Match canonical", r"(?i)exec \"", r"Match user", r"Match localuser", r"Match originalhost",
        r"Match host", r"#.*\n", r"\"[^\"]* [^\"]*\"", r"=\s*\S", r"Host web\[12\]", r"%p", r"%L", r"%i", r"%l", r"%C",
        r"%r", r"%%", r"\$\{[A-Z_]+\}", r"Port ssh", "\xe9", r"FancyNewOption", r"IgnoreUnknown", r"HostKeyAlias",
        r"ProxyJump none", r"IdentityAgent none", r"CertificateFile", r"AddressFamily inet6", r"ConnectTimeout",
    ]  # fmt: skip
    assert [c for c in constructs if not re.search(c, text)] == []
    assert len(corpus()) >= 70

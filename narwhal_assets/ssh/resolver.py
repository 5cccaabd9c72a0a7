"""The workstation's OpenSSH as the resolution engine: `ssh -G` answers what a destination resolves to.

OpenSSH evaluates its own config (Host and Match with every criterion, Include, first match wins, comments,
quoting, `=` forms, CanonicalizeHostname and the final pass) and refuses what it refuses, so nothing here
parses a config to decide anything: a query is the arguments OpenSSH itself would get (`-F`, `-l`, `-p`, `-J`
and the host), the answer is what `ssh -G` prints. Each call has a deadline (a `Match exec` command can hang),
after which its whole process group is killed.

`ssh -G` costs about 6-10 ms of CPU per call at 1,000 `Host` blocks, and a fleet command resolves each host
several times, so answers are cached per process, keyed by the query and the local account and valid while
every file the answer came from is unchanged: the config files OpenSSH read (its `-v` log lists them), what
each `Include` pattern matches now, and the environment variables they name as `${NAME}`. A file's content
is hashed once per version of the file (inode, size, mtime, ctime), so a warm lookup costs a few `stat`
calls. An answer is never cached when it can depend on anything else: a config with `Match exec` (a command
decides), `CanonicalizeHostname` (DNS decides), or a file OpenSSH read that the Include scan did not find.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from narwhal_assets.core.display import printable
from narwhal_assets.core.errors import OpenSshRefused
from narwhal_assets.ssh.tokens import LocalAccount

SSH = "ssh"
RESOLVE_TIMEOUT = 10.0
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
MAX_ENTRIES = 1 << 16
USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
READING = "debug1: Reading configuration data "
_INCLUDE = re.compile(rb"^[ \t]*include(?:[ \t]*=[ \t]*|[ \t]+)(.*?)[ \t\f\r]*$", re.IGNORECASE | re.MULTILINE)
_MATCH = re.compile(rb"^[ \t]*match(?:[ \t]*=[ \t]*|[ \t]+)(.*?)[ \t\f\r]*$", re.IGNORECASE | re.MULTILINE)
_VARIABLE = re.compile(rb"\$\{([^}]*)\}")
_NOISE = ("debug", "OpenSSH_", "Pseudo-terminal will not be allocated")  # its -v log, version line, tty note


def config_args(config: Path | None) -> list[str]:
    """`-F FILE`, or nothing for OpenSSH's own files: no config named, or the user's default config (which
    plain `ssh` reads together with the system-wide file, so `-F` would change the answer)."""
    if config is None or config == Path(USER_CONFIG).expanduser():
        return []
    return ["-F", str(config.absolute())]


def config_label(config: Path | None) -> str:
    """How messages name the config a destination was resolved through."""
    return f"ssh config {config}" if config is not None else "OpenSSH's default ssh config"


@dataclass(frozen=True)
class Query:
    """The arguments OpenSSH gets for one connection: `ssh [-F config] [-l user] [-p port] [-J jumps] host`."""

    host: str
    user: str | None = None
    port: int | None = None
    jump: str | None = None
    config: Path | None = None

    def argv(self, ssh: str = SSH) -> list[str]:
        argv = [ssh, "-G", "-v", *config_args(self.config)]
        for flag, value in (("-l", self.user), ("-p", self.port), ("-J", self.jump)):
            if value is not None:
                argv += [flag, str(value)]
        return [*argv, "--", self.host]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cached answer is one object
class Answer:
    """`ssh -G`'s answer: every option (lowercase name) with its values in OpenSSH's order."""

    options: dict[str, tuple[str, ...]]
    files: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, text: str, files: tuple[str, ...] = ()) -> Answer:
        options: dict[str, list[str]] = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key:
                options.setdefault(key.lower(), []).append(value)
        return cls({key: tuple(values) for key, values in options.items()}, files)

    def one(self, key: str) -> str | None:
        values = self.options.get(key)
        return values[0] if values else None

    def all(self, key: str) -> tuple[str, ...]:
        return self.options.get(key, ())


def ask(query: Query, timeout: float | None = None) -> Answer:
    """OpenSSH's answer for `query`, from the cache while the files it came from are unchanged; `ssh -G` is
    given `timeout` seconds (default RESOLVE_TIMEOUT)."""
    timeout = RESOLVE_TIMEOUT if timeout is None else timeout
    ssh = _ssh_binary()
    key = (query, ssh, LocalAccount.current())
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    answer = _run_ssh_g(query, ssh[0], timeout)
    entry = _entry(query, answer)
    if entry is not None:
        _CACHE.put(key, entry)
    return answer


def defaults(timeout: float | None = None) -> Answer:
    """OpenSSH's answer with no config at all (what "the config sets" is measured against), once per process
    and version of `ssh`."""
    ssh = _ssh_binary()
    found = _DEFAULTS.get(ssh)
    if found is None:
        query = Query("narwhal-defaults.invalid", config=Path(os.devnull))
        found = _DEFAULTS[ssh] = _run_ssh_g(query, ssh[0], RESOLVE_TIMEOUT if timeout is None else timeout)
    return found


def clear_cache() -> None:
    _CACHE.clear()
    _DEFAULTS.clear()


# --------------------------------------------------------------------------------------------- running ssh -G


def _run_ssh_g(query: Query, ssh: str, timeout: float) -> Answer:
    where = config_label(query.config)
    try:
        proc = subprocess.Popen(query.argv(ssh), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    except OSError as exc:
        raise OpenSshRefused(
            [f"{where}: cannot run `{ssh} -G` ({exc.strerror}); the workstation needs OpenSSH"]
        ) from None
    with _reaped(proc):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            late = f"`ssh -G` did not answer within {timeout:g} s (a Match exec command that hangs?); stopped it"
            raise OpenSshRefused([f"{where}: {late}"]) from None
    stderr = err.decode("utf-8", "replace")
    if proc.returncode != 0:
        said = [line for line in stderr.splitlines() if line.strip() and not line.startswith(_NOISE)]
        shown = "; ".join(printable(line, 200) for line in said[:3])
        raise OpenSshRefused([f"{where}: OpenSSH refuses it: {shown or f'ssh -G exited {proc.returncode}'}"])
    files = tuple(dict.fromkeys(line[len(READING) :] for line in stderr.splitlines() if line.startswith(READING)))
    return Answer.parse(out.decode("utf-8", "surrogateescape"), files)


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """On any exit but a normal one, kill the process group (Match exec children too) and reap it; a child
    that left the group and still holds the pipes is not waited for."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        proc.wait()
        raise


_WHICH: dict[str, str | None] = {}
_DEFAULTS: dict[tuple[str, tuple[int, int, int]], Answer] = {}


def _ssh_binary() -> tuple[str, tuple[int, int, int]]:
    """The `ssh` on PATH and its version of the file (an upgraded OpenSSH answers anew)."""
    path_env = os.environ.get("PATH", os.defpath)
    found = _WHICH.get(path_env)
    if found is None:
        found = _WHICH[path_env] = shutil.which(SSH, path=path_env)
    if found is None:
        raise OpenSshRefused([f"`{SSH}` is not on PATH; the workstation needs OpenSSH (its `ssh -G` resolves "
                              "destinations)"])  # fmt: skip
    info = os.stat(found)
    return found, (info.st_ino, info.st_size, info.st_mtime_ns)


# ---------------------------------------------------------------------------------------------------- the cache


@dataclass(frozen=True)
class _FileVersion:
    """What the cache needs of one version of one config file."""

    signature: tuple[int, int, int, int]
    digest: str
    includes: tuple[str, ...]  # the Include arguments, as written
    variables: tuple[str, ...]  # the ${NAME}s it names
    runs_commands: bool  # a Match with `exec`


@dataclass(frozen=True)
class _Entry:
    answer: Answer
    files: tuple[tuple[str, str], ...]  # path, digest
    globs: tuple[tuple[str, tuple[str, ...]], ...]  # anchored pattern, what it matched
    environ: tuple[tuple[str, str | None], ...]

    def valid(self) -> bool:
        for path, digest in self.files:
            version = _version(path)
            if version is None or version.digest != digest:
                return False
        if any(_matches(pattern) != matched for pattern, matched in self.globs):
            return False
        return all(os.environ.get(name) == value for name, value in self.environ)


class _Cache:
    def __init__(self) -> None:
        self._entries: dict[object, _Entry] = {}
        self._lock = threading.Lock()

    def get(self, key: object) -> Answer | None:
        with self._lock:
            entry = self._entries.get(key)
        return entry.answer if entry is not None and entry.valid() else None

    def put(self, key: object, entry: _Entry) -> None:
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHE = _Cache()
_VERSIONS: dict[str, _FileVersion] = {}


def _entry(query: Query, answer: Answer) -> _Entry | None:
    """The cache entry for an answer, or None when the answer may depend on more than the files it came from."""
    if (answer.one("canonicalizehostname") or "false") != "false":
        return None
    files: dict[str, str] = {}
    globs: dict[str, tuple[str, ...]] = {}
    variables: set[str] = set()
    roots = [(query.config, True)] if config_args(query.config) else [(Path(USER_CONFIG).expanduser(), True),
                                                                     (Path(SYSTEM_CONFIG), False)]  # fmt: skip
    pending: list[tuple[str, bool, int]] = []
    for path, user in roots:
        assert path is not None
        name = str(path.absolute())
        globs[name] = _matches(name)
        pending += [(found, user, 0) for found in globs[name]]
    while pending:
        file, user, depth = pending.pop()
        version = _version(file)
        if version is None or version.runs_commands or depth > MAX_INCLUDE_DEPTH:
            return None
        files[file] = version.digest
        variables.update(version.variables)
        for pattern in _include_patterns(version.includes, user):
            globs[pattern] = _matches(pattern)
            pending += [(found, user, depth + 1) for found in globs[pattern] if found not in files]
    if not set(answer.files) <= set(files):
        return None  # OpenSSH read a file the scan did not find: no way to know when the answer changes
    environ = tuple((name, os.environ.get(name)) for name in sorted(variables))
    return _Entry(answer, tuple(sorted(files.items())), tuple(sorted(globs.items())), environ)


def _version(path: str) -> _FileVersion | None:
    """The file's version now, read and scanned once per (inode, size, mtime, ctime); None if unreadable."""
    try:
        info = os.stat(path)
        signature = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        known = _VERSIONS.get(path)
        if known is not None and known.signature == signature:
            return known
        data = Path(path).read_bytes()
    except OSError:
        return None
    matches = (line.lower().split() for line in _MATCH.findall(data))
    version = _FileVersion(
        signature=signature,
        digest=hashlib.sha256(data).hexdigest(),
        includes=tuple(line.decode("utf-8", "surrogateescape") for line in _INCLUDE.findall(data)),
        variables=tuple(sorted({name.decode("utf-8", "surrogateescape") for name in _VARIABLE.findall(data)})),
        runs_commands=any(word.lstrip(b"!").strip(b"\"'") == b"exec" for words in matches for word in words),
    )
    if len(_VERSIONS) >= MAX_ENTRIES:
        _VERSIONS.clear()
    _VERSIONS[path] = version
    return version


def _include_patterns(lines: tuple[str, ...], user: bool) -> Iterator[str]:
    """Each Include argument anchored as OpenSSH anchors it: relative to ~/.ssh in a user config, to /etc/ssh
    in the system-wide one; `~` is expanded by glob(3) (from $HOME)."""
    for line in lines:
        for word in argv_split(line):
            if not word.startswith(("/", "~")):
                word = ("~/.ssh/" if user else "/etc/ssh/") + word
            yield os.path.expanduser(word)


def _matches(pattern: str) -> tuple[str, ...]:
    if not glob.has_magic(pattern):
        return (pattern,) if os.path.lexists(pattern) else ()
    return tuple(sorted(glob.glob(pattern)))


def argv_split(text: str) -> list[str]:
    """OpenSSH's `argv_split` for a config line's arguments: whitespace separates, double or single quotes
    group, a backslash escapes a quote, a backslash or (unquoted) a space, an unquoted `#` starting a word
    ends the line."""
    words: list[str] = []
    i, end = 0, len(text)
    while i < end:
        while i < end and text[i] in " \t":
            i += 1
        if i >= end or text[i] == "#":
            break
        word: list[str] = []
        quote = ""
        while i < end and (quote or text[i] not in " \t"):
            ch = text[i]
            nxt = text[i + 1] if i + 1 < end else ""
            if ch == "\\" and (nxt in ("'", '"', "\\") or (not quote and nxt == " ")) and nxt:
                word.append(nxt)
                i += 1
            elif not quote and ch in "\"'":
                quote = ch
            elif quote and ch == quote:
                quote = ""
            else:
                word.append(ch)
            i += 1
        words.append("".join(word))
    return words

"""Host-side installer: runs on a fleet host, fed on stdin over the host's one SSH connection.

Standard library only, Python 3.8+, ASCII source: hosts do not have this package. The workstation starts
`python3 -I -S -c BOOTSTRAP` and writes `<length>\\n<this source + main('<json params>')>` to its stdin, followed
(for `install`) by the raw bytes of every file listed in `send`, in that order; sizes come from the params,
so the stream needs no framing. The one stdout line is a JSON report parsed by
`narwhal_assets.protocols.install`; commands' output is captured into it, never inherited.

Actions, all on `~/<remote_dir>` (created with umask 077):
- `inspect`: read-only. Which files are present with the right hash; when the completion marker names the
  revision, verify everything (files, placed files, HEAD, clean tree): outcome `reused`.
- `install`: under the lock (`mkdir .install-lock`, owner info inside, removed when this program exits),
  receive each file to a temporary name, hash-check it, link it into place; clone the bundle into
  `checkout/`, require HEAD == revision and a clean tree, place role files, create `.venv`, run the install
  and check commands: outcome `ready`. The marker is NOT written here: a host whose connection died
  mid-install must not claim completion, so the workstation commits it only after reading this report.
- `commit`: under the lock, verify everything again, write `.installed-files` (SHA-256 of the file list as
  sent, so a directory says which file set it claims) then the marker (revision + newline), then move
  `current`: `installed`; with `activate: false` it stops before moving `current`: `staged`.
- `activate`: under the lock, require the marker to name the revision, verify everything, move `current`.
- `status`: read-only, on `~/<remote_base>/`: every entry (bounded), its marker state and revision, which one
  `current` names, and for the deployments whose file list the workstation passed (`known`), `intact` or
  the first problem found.
- `prune`: for each id in `remove`, under that deployment's lock and never `current`'s target: rename it to
  `.removing-<id>-<pid>` (a cut connection leaves nothing that looks like a deployment), then delete it.

`~/<remote_base>/current` is a relative symlink to the deployment in service, replaced by one `rename` of a
new symlink, only under the deployment's lock, after its marker is there and everything verified.

A file already in place with other content, a symlink or a non-regular file stops the host at the gate
that found it and is left as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

REPORT_SCHEMA = "narwhal.install-report"
MARKER = "installed"
LOCK = ".install-lock"
LOCK_OWNER = "owner.json"
CHECKOUT = "checkout"
VENV = ".venv"
BUNDLE = "source.bundle"
CHUNK = 1 << 20
OUTPUT_LIMIT = 64 * 1024
MARKER_LIMIT = 256
FILE_SET = ".installed-files"
CURRENT = "current"
ENTRY_LIMIT = 256
COMMAND_TIMEOUT_S = 3600.0
GIT_TIMEOUT_S = 600.0
ACTIONS = ("inspect", "install", "commit", "activate", "status", "prune")


class GateFailure(Exception):
    """One named gate stopped this host; the message says what and where (relative to the remote dir)."""

    def __init__(self, gate: str, message: str) -> None:
        super().__init__(message)
        self.gate = gate
        self.message = message


class _Stop(BaseException):
    """Raised by the signal handler so every `finally` (lock removal, temp cleanup) still runs."""


class Installer:
    def __init__(self, params: dict) -> None:
        self.params = params
        home = os.path.expanduser("~")
        self.base = os.path.join(home, params.get("remote_base") or params["remote_dir"])
        # `~/Narwhal-deploy`, where `current` is: the base itself for `status` and `prune`
        self.top = self.base if params.get("remote_base") else os.path.dirname(self.base)
        self.revision = params.get("revision", "")
        self.files = params.get("files", [])
        self.detail: dict = {}
        self.steps: list = []
        self.states: dict = {}
        self.verified = 0
        self.received = 0
        self.bytes_received = 0
        self.lock_taken = False
        self.temps: list = []

    # ----------------------------------------------------------------- helpers

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    def run(self, argv: list, gate: str, cwd: str, env: dict | None = None, timeout: float = GIT_TIMEOUT_S) -> str:
        """Run one command, record it as a step (argv, exit status, bounded output); fail `gate` on non-zero."""
        began = time.monotonic()
        try:
            proc = subprocess.run(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, timeout=timeout, check=False,
            )  # fmt: skip
            rc, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            rc, out = -1, (exc.output or b"") + f"\n[timed out after {timeout:.0f} s]\n".encode()
        except OSError as exc:
            rc, out = 127, f"cannot run {argv[0]}: {exc.strerror}\n".encode()
        text = out[:OUTPUT_LIMIT].decode("utf-8", "replace")
        if len(out) > OUTPUT_LIMIT:
            text += f"\n[... {len(out) - OUTPUT_LIMIT} bytes truncated]\n"
        self.steps.append({"argv": argv, "rc": rc, "output": text, "seconds": round(time.monotonic() - began, 3)})
        if rc != 0:
            raise GateFailure(gate, f"{_show(argv)} exited {rc}")
        return text

    def git(self, *args: str, gate: str = "checkout") -> str:
        return self.run(["git", "-C", self.path(CHECKOUT), *args], gate, cwd=self.base)

    # ----------------------------------------------------------------- files

    def file_state(self, entry: dict) -> str:
        """`present` (regular, right hash) or `missing`; anything else fails the `verify file` gate."""
        where = self.path(entry["name"])
        try:
            info = os.lstat(where)
        except FileNotFoundError:
            return "missing"
        _regular(info, entry["name"], "verify file")
        if _sha256(where) != entry["sha256"]:
            raise GateFailure("verify file", f"{entry['name']}: content differs from the manifest (left as it is)")
        self.verified += 1
        return "present"

    def verify_files(self, require: bool) -> None:
        for entry in self.files:
            state = self.file_state(entry)
            self.states[entry["name"]] = state
            if require and state != "present":
                raise GateFailure("verify file", f"{entry['name']}: missing")

    def receive(self) -> None:
        """Read every sent file from stdin to a temporary name, hash-check it, then link it into place."""
        sizes = {e["name"]: e for e in self.files}
        for name in self.params.get("send", []):
            entry = sizes[name]
            temp = self.path(f".{name.replace('/', '_')}.part-{os.getpid()}")
            self.temps.append(temp)
            digest = hashlib.sha256()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                left = entry["size"]
                while left:
                    block = sys.stdin.buffer.read(min(CHUNK, left))
                    if not block:
                        raise GateFailure("transfer", f"{name}: the stream ended {left} bytes early")
                    digest.update(block)
                    handle.write(block)
                    left -= len(block)
                handle.flush()
                os.fsync(handle.fileno())
            self.bytes_received += entry["size"]
            if digest.hexdigest() != entry["sha256"]:
                raise GateFailure("transfer", f"{name}: received content does not match the manifest hash")
            target = self.path(name)
            _make_dirs(os.path.dirname(target), self.base)
            if self.file_state(entry) == "missing":
                os.link(temp, target)
                self.received += 1
            os.unlink(temp)
            self.temps.remove(temp)

    def place(self) -> None:
        """Copy each file with `install_to` into the checkout; an existing different file stops the host."""
        checkout = self.path(CHECKOUT)
        for entry in self.files:
            if not entry.get("install_to"):
                continue
            target = os.path.join(checkout, entry["install_to"])
            _make_dirs(os.path.dirname(target), checkout)
            try:
                info = os.lstat(target)
            except FileNotFoundError:
                temp = f"{target}.part-{os.getpid()}"
                self.temps.append(temp)
                shutil.copyfile(self.path(entry["name"]), temp, follow_symlinks=False)
                os.chmod(temp, 0o600)
                os.link(temp, target)
                os.unlink(temp)
                self.temps.remove(temp)
                continue
            self.verify_placed(entry, info, "place file")

    def verify_placed(self, entry: dict, info: os.stat_result | None, gate: str) -> None:
        target = os.path.join(self.path(CHECKOUT), entry["install_to"])
        shown = f"{CHECKOUT}/{entry['install_to']}"
        if info is None:
            try:
                info = os.lstat(target)
            except FileNotFoundError:
                raise GateFailure(gate, f"{shown}: missing") from None
        _regular(info, shown, gate)
        if entry.get("keep_if_present"):
            return  # the operator may edit it after install (the router's effective fleet)
        if _sha256(target) != entry["sha256"]:
            raise GateFailure(gate, f"{shown}: content differs from the manifest (left as it is)")
        self.verified += 1

    # ----------------------------------------------------------------- checkout and environment

    def clone(self) -> None:
        """Clone the bundle into a temporary directory and rename it: a cut connection leaves no half checkout."""
        checkout = self.path(CHECKOUT)
        if os.path.lexists(checkout):
            if not stat.S_ISDIR(os.lstat(checkout).st_mode):
                raise GateFailure("checkout", f"{CHECKOUT} is not a directory (left as it is)")
            return
        temp = self.path(f"{CHECKOUT}.part-{os.getpid()}")
        self.temps.append(temp)
        self.run(["git", "clone", "--quiet", "--no-checkout", "--", self.path(BUNDLE), temp], "checkout", self.base)
        self.run(["git", "-C", temp, "checkout", "--quiet", "--detach", self.revision], "checkout", self.base)
        os.rename(temp, checkout)
        self.temps.remove(temp)

    def verify_checkout(self) -> None:
        head = self.git("rev-parse", "--verify", "HEAD").strip()
        if head != self.revision:
            raise GateFailure("checkout", f"{CHECKOUT}: HEAD is {head[:80]}, not the approved revision")
        dirty = self.git("status", "--porcelain", "--untracked-files=no")
        if dirty.strip():
            raise GateFailure("checkout", f"{CHECKOUT}: tracked files differ from the revision (left as they are)")

    def environment(self) -> dict:
        venv = self.path(CHECKOUT, VENV)
        env = dict(os.environ)
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env.pop("PYTHONHOME", None)
        return env

    def venv_and_commands(self) -> None:
        checkout = self.path(CHECKOUT)
        if not os.path.exists(os.path.join(checkout, VENV, "bin", "python")):
            self.run([sys.executable, "-m", "venv", VENV], "venv", checkout)
        env = self.environment()
        for gate in ("install", "check"):
            command = self.params.get(gate + "_command")
            if command:
                self.run(["/bin/sh", "-c", command], gate, checkout, env, COMMAND_TIMEOUT_S)

    def verify_all(self) -> None:
        self.verified = 0
        self.verify_files(require=True)
        self.verify_checkout()
        for entry in self.files:
            if entry.get("install_to"):
                self.verify_placed(entry, None, "verify file")

    def marker(self) -> str | None:
        where = self.path(MARKER)
        try:
            info = os.lstat(where)
        except FileNotFoundError:
            return None
        _regular(info, MARKER, "marker")
        with open(where, "rb") as handle:
            return handle.read(MARKER_LIMIT).decode("ascii", "replace")

    def write_marker(self) -> None:
        """The file set first, the marker last: a marker always comes with the file set it was written for."""
        self.write_atomic(FILE_SET, files_sha256(self.files) + "\n")
        self.write_atomic(MARKER, self.revision + "\n")

    def write_atomic(self, name: str, text: str) -> None:
        temp = self.path(f".{name}.part-{os.getpid()}")
        self.temps.append(temp)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("ascii"))
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temp, self.path(name))
        self.temps.remove(temp)

    def move_current(self) -> None:
        """Point `current` at this deployment: a new symlink renamed over the old one (atomic)."""
        where = os.path.join(self.top, CURRENT)
        if os.path.lexists(where) and not os.path.islink(where):
            raise GateFailure("current", f"{CURRENT} is not a symlink (left as it is)")
        temp = os.path.join(self.top, f"{CURRENT}.part-{os.getpid()}")
        self.temps.append(temp)
        os.symlink(os.path.basename(self.base), temp)
        os.rename(temp, where)
        self.temps.remove(temp)

    # ----------------------------------------------------------------- lock

    def lock(self) -> None:
        """`mkdir .install-lock`; a lock whose owner process is gone (killed host session) is taken over."""
        where = self.path(LOCK)
        for _ in range(2):
            try:
                os.mkdir(where, 0o700)
            except FileExistsError:
                owner = _read_owner(where)
                if _process_alive(owner):
                    raise GateFailure("lock", f"{LOCK} is held by {_describe_owner(owner)}") from None
                self.discard_leftovers(owner)
                shutil.rmtree(where, ignore_errors=True)
                continue
            self.lock_taken = True
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            info = {"pid": os.getpid(), "start": _start_ticks(os.getpid()), "boot": _boot_id(), "since": since,
                    "by": self.params.get("owner", "")}  # fmt: skip
            with open(os.path.join(where, LOCK_OWNER), "w", encoding="utf-8") as handle:
                json.dump(info, handle)
            return
        raise GateFailure("lock", f"{LOCK} could not be taken")

    def unlock(self) -> None:
        if self.lock_taken:
            shutil.rmtree(self.path(LOCK), ignore_errors=True)
            self.lock_taken = False

    def discard_leftovers(self, owner: dict | None) -> None:
        """Remove what the dead owner of a stale lock left half-made: names ending in `.part-<its pid>`."""
        pid = (owner or {}).get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return
        checkout = self.path(CHECKOUT)
        places = {self.base} | {os.path.dirname(os.path.join(checkout, e["install_to"]))
                                for e in self.files if e.get("install_to")}  # fmt: skip
        for place in places:
            with contextlib.suppress(OSError), os.scandir(place) as entries:
                self.temps += [e.path for e in entries if e.name.endswith(f".part-{pid}")]
        self.cleanup()

    def cleanup(self) -> None:
        for temp in self.temps:
            if os.path.isdir(temp) and not os.path.islink(temp):
                shutil.rmtree(temp, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
        self.temps = []

    # ----------------------------------------------------------------- actions

    def inspect(self) -> str:
        if not os.path.lexists(self.base):
            self.states = {e["name"]: "missing" for e in self.files}
            return "absent"
        _plain_dir(self.base)
        found = self.marker()
        if found is None:
            self.verify_files(require=False)
            return "incomplete"
        self.require_marker(found)
        self.verify_all()
        return "reused"

    def require_marker(self, found: str | None) -> None:
        if found is None:
            raise GateFailure("marker", f"{MARKER}: missing (the install did not complete)")
        if found != self.revision + "\n":
            raise GateFailure("marker", f"{MARKER} names another revision (left as it is)")

    def install(self) -> str:
        _make_dirs(self.base, os.path.expanduser("~"))
        self.lock()
        self.receive()
        self.verify_files(require=True)
        self.clone()
        self.verify_checkout()
        self.place()
        self.venv_and_commands()
        self.verify_checkout()
        return "ready"

    def commit(self) -> str:
        _plain_dir(self.base)
        self.lock()
        self.verify_all()
        self.write_marker()
        if not self.params.get("activate", True):
            return "staged"  # complete and verified; `activate` moves `current` later
        self.move_current()
        return "installed"

    def activate(self) -> str:
        _plain_dir(self.base)
        self.lock()
        self.require_marker(self.marker())
        self.verify_all()
        self.move_current()
        return "activated"

    def status(self) -> str:
        self.detail = {"current": _current_target(self.top), "deployments": [], "truncated": False}
        if not os.path.lexists(self.top):
            return "listed"
        _plain_dir(self.top)
        known = self.params.get("known", {})
        with os.scandir(self.top) as entries:
            for count, entry in enumerate(entries):
                if count >= ENTRY_LIMIT:
                    self.detail["truncated"] = True
                    break
                if entry.name != CURRENT:
                    self.detail["deployments"].append(self.describe(entry.name, known.get(entry.name)))
        self.detail["deployments"].sort(key=lambda d: d["name"])
        return "listed"

    def describe(self, name: str, known: dict | None) -> dict:
        """One entry of the base directory; a foreign name or a non-directory is never read."""
        where = os.path.join(self.top, name)
        found = {"name": name[:64], "state": "foreign", "revision": None, "file_set": None, "installed_at": None,
                 "check": "unknown", "problem": None}  # fmt: skip
        if not _deployment_id(name) or not stat.S_ISDIR(os.lstat(where).st_mode):
            return found
        known = known or {}
        one = Installer({"remote_dir": os.path.relpath(where, os.path.expanduser("~")),
                         "revision": known.get("revision", ""), "files": known.get("files", [])})  # fmt: skip
        try:
            marker = one.marker()
            found["file_set"] = _read_line(os.path.join(where, FILE_SET))
        except GateFailure as failure:
            return {**found, "state": "incomplete", "check": "tampered", "problem": failure.message}
        found["revision"] = marker.strip()[:64] if marker else None
        found["installed_at"] = os.lstat(os.path.join(where, MARKER)).st_mtime if marker else None
        lock = os.path.join(where, LOCK)
        if os.path.lexists(lock) and _process_alive(_read_owner(lock)):
            return {**found, "state": "locked"}
        found["state"] = "installed" if marker else "incomplete"
        if not known or marker is None:
            return found
        try:
            if found["file_set"] not in (None, files_sha256(one.files)):
                raise GateFailure("marker", f"{FILE_SET}: names another file set")
            one.require_marker(marker)
            one.verify_all()
        except GateFailure as failure:
            return {**found, "check": "tampered", "problem": failure.message}
        return {**found, "check": "intact"}

    def prune(self) -> str:
        """Remove each named deployment, re-checked here: never `current`'s target, never a locked one."""
        self.detail = {"removed": [], "kept": {}, "leftovers_removed": self.remove_leftovers()}
        for name in self.params.get("remove", [])[:ENTRY_LIMIT]:
            reason = self.remove(name)
            if reason:
                self.detail["kept"][name[:64]] = reason
            else:
                self.detail["removed"].append(name)
        return "pruned"

    def remove_leftovers(self) -> int:
        """Delete `.removing-<id>-<pid>` directories whose pruning process is gone (a cut connection)."""
        count = 0
        if not os.path.isdir(self.top):
            return 0
        with os.scandir(self.top) as entries:
            names = [e.name for e in itertools.islice(entries, ENTRY_LIMIT) if e.name.startswith(".removing-")]
        for name in names:
            pid = name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _start_ticks(int(pid)):
                shutil.rmtree(os.path.join(self.top, name), ignore_errors=True)
                count += 1
        return count

    def remove(self, name: str) -> str | None:
        """Why `name` stays, or None once it is gone."""
        where = os.path.join(self.top, name)
        if not _deployment_id(name) or not os.path.lexists(where) or not stat.S_ISDIR(os.lstat(where).st_mode):
            return "not a deployment directory here"
        one = Installer({"remote_dir": os.path.relpath(where, os.path.expanduser("~"))})
        try:
            one.lock()
        except GateFailure as failure:
            return failure.message
        try:
            if _current_target(self.top) == name:
                return "current points at it"
            gone = os.path.join(self.top, f".removing-{name}-{os.getpid()}")
            os.rename(where, gone)
            one.lock_taken = False  # the lock went with the directory
        finally:
            one.unlock()
        shutil.rmtree(gone)
        return None


# --------------------------------------------------------------------- file system helpers


def files_sha256(files: list) -> str:
    """The file list's digest as `.installed-files` holds it (the workstation computes the same)."""
    text = json.dumps(files, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _deployment_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _current_target(top: str) -> str | None:
    """The deployment id `current` names; "" when it is there but not a symlink to a deployment id."""
    try:
        target = os.readlink(os.path.join(top, CURRENT))
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    return target if _deployment_id(target) else ""


def _read_line(path: str) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    _regular(info, os.path.basename(path), "marker")
    with open(path, "rb") as handle:
        return handle.read(MARKER_LIMIT).decode("ascii", "replace").strip()[:64]


def _show(argv: list) -> str:
    return " ".join(str(a) for a in argv)[:200]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _regular(info: os.stat_result, shown: str, gate: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise GateFailure(gate, f"{shown} is a symlink (left as it is)")
    if not stat.S_ISREG(info.st_mode):
        raise GateFailure(gate, f"{shown} is not a regular file (left as it is)")


def _plain_dir(path: str) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise GateFailure("verify file", f"{path} is not a directory (left as it is)")


def _make_dirs(path: str, top: str) -> None:
    """Create `path` below `top` (0700 each); every existing component must be a real directory."""
    relative = os.path.relpath(path, top)
    current = top
    for part in [] if relative == "." else relative.split(os.sep):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                raise GateFailure("place file", f"{current} is not a directory (left as it is)") from None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """The process start time in clock ticks since boot (field 22 of /proc/PID/stat); "" when it is gone or
    unknown. A zombie is gone: it has exited and holds nothing, though its parent (a killed sshd session
    reparented to an init that is slow to reap) may leave its /proc entry for a while."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read(4096).decode("ascii", "replace")
    except OSError:
        return ""
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else ""


def _read_owner(lock_dir: str) -> dict | None:
    try:
        with open(os.path.join(lock_dir, LOCK_OWNER), encoding="utf-8") as handle:
            owner = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _process_alive(owner: dict | None) -> bool:
    """Whether the lock's owner still runs: same boot, and its pid is the same process (start time matches).

    An owner that cannot be read (a lock made by hand, or one whose owner died before writing it) holds.
    """
    if owner is None:
        return True
    if owner.get("boot") and owner.get("boot") != _boot_id():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return True
    now = _start_ticks(pid)
    return bool(now) and (not owner.get("start") or now == owner.get("start"))


def _describe_owner(owner: dict | None) -> str:
    if owner is None:
        return f"an unknown owner (no readable {LOCK_OWNER})"
    by = str(owner.get("by", "?"))[:200]
    return f"{by} (pid {owner.get('pid', '?')}) since {owner.get('since', '?')}"


def _drain_stdin() -> None:
    try:
        while sys.stdin.buffer.read(CHUNK):
            pass
    except OSError:
        pass


def _on_signal(signum: int, frame: object) -> None:
    raise _Stop()


def main(params_json: str) -> None:
    params = json.loads(params_json)
    os.umask(0o077)
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _on_signal)
    if params.get("action") not in ACTIONS:
        raise SystemExit("unknown action")
    installer = Installer(params)
    began = time.monotonic()
    report = {"schema": REPORT_SCHEMA, "schema_version": 1, "action": params["action"]}
    if params["action"] != "status":  # where `current` pointed before this action (status lists it itself)
        report["current"] = _current_target(installer.top)
    try:
        report["outcome"] = getattr(installer, params["action"])()
    except GateFailure as failure:
        report.update(outcome="failed", gate=failure.gate, message=failure.message)
    except _Stop:
        report.update(outcome="failed", gate="interrupted", message="the installer was stopped by a signal")
    except OSError as exc:
        shown = os.path.relpath(exc.filename, installer.base) if exc.filename else ""
        report.update(outcome="failed", gate="io", message=f"{shown}: {exc.strerror}")
    finally:
        installer.cleanup()
        installer.unlock()
        _drain_stdin()
    report.update(
        **installer.detail, files=installer.states, files_verified=installer.verified,
        files_received=installer.received, bytes_received=installer.bytes_received, steps=installer.steps,
        seconds=round(time.monotonic() - began, 3),
    )  # fmt: skip
    try:
        sys.stdout.write(json.dumps(report, ensure_ascii=True) + "\n")
        sys.stdout.flush()
    except OSError:
        pass  # the workstation is gone: it treats the host as failed and no marker was written

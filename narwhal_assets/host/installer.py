"""Host-side installer: runs on a fleet host, fed on stdin over the host's one SSH connection.

Standard library only, Python 3.8+, ASCII source: hosts do not have this package. The transport's guard
(`guard.py`, `-`) runs it in its own interpreter from what stdin carries (`narwhal_assets.host.program_stream`):
`<length>\\n<this source + main('<json params>')>`, followed (for `install`) by the raw bytes of every file
listed in `send`, in that order; sizes come from the params, so the stream needs no framing. The one stdout
line is a JSON report parsed by `narwhal_assets.protocols.install`; commands' output is captured into it, never
inherited.

Actions, all on `~/<remote_dir>` (created with umask 077):
- `inspect`: read-only. Which files are present with the right hash; when the completion marker names the
  revision, verify everything (files, placed files, HEAD, clean tree): outcome `reused`.
- `install`: under the lock (`.install-lock`, owner info inside, removed when this program exits),
  receive each file to a temporary name, hash-check it, link it into place; clone the bundle into
  `checkout/`, require HEAD == revision and a clean tree, place role files, create `.venv`, run the install
  and check commands, verify everything again, then write `.installed-files` (SHA-256 of the file list as
  sent, so a directory says which file set it claims) and the marker (revision + newline) last: outcome
  `staged`; `current` is untouched. An installer stopped before the marker (a failed gate, the budget spent,
  a signal: sshd hangs up when the workstation's connection goes) leaves none, so the host never claims
  completion for work that did not finish; one run, not a second call, so a first install costs the
  workstation one installer round trip fewer per host.
- `activate`: under the lock, require the marker to name the revision, verify everything, move `current`.
- `status`: read-only, on `~/<remote_base>/`: every entry (bounded), its marker state and revision, which one
  `current` names, and for the deployments whose file list the workstation passed (`known`), `intact` or
  the first problem found.
- `prune`: for each id in `remove`, under that deployment's lock and never `current`'s target: rename it to
  `.removing-<id>-<pid>` (a cut connection leaves nothing that looks like a deployment), then delete it.

`~/<remote_base>/current` is a relative symlink to the deployment in service, replaced by one `rename` of a
new symlink, only under the deployment's lock, after its marker is there and everything verified. Staging
(`inspect`, `install`) already requires `current` to be absent or a symlink to a deployment directory here,
so an activation that would fail on it fails while no host has moved.

The lease (`host/lease.py`, whose source follows this one on the host when the action is given a lease):
`install`, `activate` and `prune` need the operation's lease on this host (`lease.mode`: `acquire` takes it,
`hold` requires it still ours), and the completion marker, the `current` switch and a prune's rename each
happen under the lease guard after checking that the lease still names the operation's token (fencing: an
operation paused past its lease and taken over changes nothing more here). `lease.release` (`after`, or
`when_current`: only when `inspect` found this deployment complete and already current) releases it when
the action ends.

A file already in place with other content, a symlink or a non-regular file stops the host at the gate
that found it and is left as it was.

What this program trusts, never follows, never runs (every action):
- Paths: each directory from the home directory down is `lstat`ed and must be a real directory; files are
  opened `O_NOFOLLOW|O_NONBLOCK` and `fstat`ed (regular, bounded size) before a byte is read, so a symlink
  planted where a directory belongs (`Narwhal-deploy`, the deployment, `checkout`, `.venv`, a placed file's
  directory, the lock) stops the host at a named gate and a FIFO never blocks it.
- Results: a step's result is verified before it is trusted: received files by hash, the checkout by
  comparing each tracked file's content with the revision's tree, the virtualenv by what `python -m venv`
  leaves when it completed (a half-made one is rebuilt); the marker is written only over all of them.
- git: no system or global config, no inherited `GIT_*` variable, no hooks, no fsmonitor, no replace
  objects, no index refresh; an index flag that hides changes (assume-unchanged, skip-worktree) is a tamper.
- The lock: at most one installer per deployment directory. It is made complete or not at all (a directory
  of the installer's own with its flushed owner record, renamed to `.install-lock`: a held lock is never
  empty, and a rename never replaces a non-empty directory), and made, judged, taken over when stale
  (renamed away, then a fresh lock) and swept of killed installers' lock directories only under an
  exclusive `flock` of the deployment directory; an installer removes only a lock whose owner record is its
  own, renaming it away before deleting it. A lock without a readable owner record (an older installer's,
  killed between `mkdir` and writing it, or one made by hand) is stale once unchanged for 600 s or since
  before this boot.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import time

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` on the host
if TYPE_CHECKING:  # annotations only: hosts may run Python 3.8
    from typing import Any

# In the package the lease is its own module; on a host its source follows this one in the same program,
# for an action given a lease (the only ones that reach these names: `take_lease` refuses without one).
with contextlib.suppress(ImportError):
    from narwhal_assets.host.lease import HostLease, LeaseRefused, flock_within

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
# Every command of one action ends within this budget (the `budget_s` parameter), so a hanging install
# command fails here at its own gate, with its output, before the workstation's command timeout
# (`SshSettings.command_timeout_s`, 600 s) gives up on the whole connection.
ACTION_BUDGET_S = 540.0
OWNER_LIMIT = 4096
# A lock with no readable owner record is never made by this version (its lock appears complete or not at
# all) but by hand, or left by an older installer killed (or out of disk) between `mkdir` and writing it.
# It holds until it has not changed for longer than any installer run lasts (the workstation's command
# timeout, 600 s, ends the run), or since before this boot; then it is stale like a dead owner's.
OWNERLESS_STALE_S = 600.0
LOCK_WAIT_S = 60.0  # the longest wait for the deployment directory's flock (held only to change the lock)
FILE_SET_LIMIT = 256
GIT_OUTPUT_LIMIT = 64 << 20
ACTIONS = ("inspect", "install", "activate", "status", "prune")
# git reads no configuration but the checkout's own, overridden here where it could run a program or hide
# a change; the environment carries no inherited GIT_* variable (GIT_CONFIG_COUNT, GIT_DIR, ...).
GIT_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false",
               "-c", "core.trustctime=true", "-c", "core.checkStat=default", "-c", "core.sparseCheckout=false",
               "-c", "core.autocrlf=false", "-c", "core.symlinks=true", "-c", "core.filemode=true")  # fmt: skip
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_NO_REPLACE_OBJECTS": "1",
           "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_ATTR_NOSYSTEM": "1"}  # fmt: skip


class GateFailure(Exception):
    """One named gate stopped this host; the message says what and where (relative to the remote dir)."""

    def __init__(self, gate: str, message: str) -> None:
        super().__init__(message)
        self.gate = gate
        self.message = message


class _Stop(BaseException):
    """Raised by the signal handler so every `finally` (lock removal, temp cleanup) still runs."""


class Installer:
    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.home = os.path.expanduser("~")
        self.base = os.path.join(self.home, params.get("remote_base") or params["remote_dir"])
        # `~/Narwhal-deploy`, where `current` is: the base itself for `status` and `prune`
        self.top = self.base if params.get("remote_base") else os.path.dirname(self.base)
        self.revision = params.get("revision", "")
        self.files = params.get("files", [])
        self.detail: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self.states: dict[str, Any] = {}
        self.verified = 0
        self.received = 0
        self.bytes_received = 0
        self.lock_owner: dict[str, Any] | None = None  # the owner record of the lock this installer holds
        self.notes: list[str] = []  # what the report says besides its outcome (a stale lock taken over)
        self.temps: list[str] = []
        self.budget = float(params.get("budget_s", ACTION_BUDGET_S))
        self.deadline = time.monotonic() + self.budget
        lease = params.get("lease")
        shown_top = params.get("remote_base") or os.path.dirname(params["remote_dir"])
        self.lease = HostLease(self.home, shown_top, lease) if isinstance(lease, dict) else None
        self.lease_mode = lease.get("mode") if isinstance(lease, dict) else None
        self.lease_release = lease.get("release", "never") if isinstance(lease, dict) else "never"

    # ----------------------------------------------------------------- the operation's lease

    def take_lease(self) -> None:
        """Before any change: the operation's lease on this host, taken (`acquire`) or still ours (`hold`)."""
        if self.lease is None:
            raise GateFailure("lease", "no lease was given: a change needs the operation's lease on this host")
        with _lease_gate():
            if self.lease_mode == "acquire":
                self.lease.acquire()
            else:
                self.lease.renew()

    @contextlib.contextmanager
    def fenced(self):  # type: ignore[no-untyped-def]
        """The caller's change runs under the lease guard, once the lease is seen to be still ours."""
        if self.lease is None:
            raise GateFailure("lease", "no lease was given: a change needs the operation's lease on this host")
        with _lease_gate(), self.lease.fenced():
            yield

    def end_lease(self, outcome: str, current: str | None) -> None:
        """Release the lease as asked: `after` the action, or `when_current` (this deployment is complete and
        already current: the operation has nothing to do here)."""
        done = self.lease_release == "after" or (
            self.lease_release == "when_current" and outcome == "reused" and current == os.path.basename(self.base)
        )
        if self.lease is not None and done:
            with contextlib.suppress(LeaseRefused, OSError):
                self.lease.release()

    # ----------------------------------------------------------------- helpers

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    def run(self, argv: list[str], gate: str, cwd: str, env: dict[str, str] | None = None,
            timeout: float = GIT_TIMEOUT_S, quiet: bool = False) -> str:  # fmt: skip
        """Run one command, record it as a step (argv, exit status, bounded output); fail `gate` on non-zero.
        A `quiet` step (a read-only listing the installer parses itself) records its output only when it fails:
        a verified checkout's file list is not host output worth a report's or a log's bytes.

        Bounded by `timeout` and by what is left of the action's budget: on expiry the command and every
        process it started are killed and the command's own gate fails (not the workstation's connection).
        """
        began = time.monotonic()
        limit = min(timeout, self.deadline - began)
        if limit <= 0:
            raise GateFailure(gate, f"{_show(argv)}: not started, the action's {self.budget:.0f} s budget is spent")
        timed_out = False
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        except OSError as exc:
            rc, out = 127, f"cannot run {argv[0]}: {exc.strerror}\n".encode()
        else:
            try:
                out, _ = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                out = _stop_tree(proc)
            rc = -1 if timed_out else proc.returncode
        text = out[:OUTPUT_LIMIT].decode("utf-8", "replace")
        if len(out) > OUTPUT_LIMIT:
            text += f"\n[... {len(out) - OUTPUT_LIMIT} bytes truncated]\n"
        if timed_out:
            text += f"\n[did not finish within {limit:.0f} s; stopped it]\n"
        shown = "" if quiet and rc == 0 and not timed_out else text
        self.steps.append({"argv": argv, "rc": rc, "output": shown, "seconds": round(time.monotonic() - began, 3)})
        if timed_out:
            raise GateFailure(gate, f"{_show(argv)} did not finish within {limit:.0f} s (stopped it)")
        if rc != 0:
            raise GateFailure(gate, f"{_show(argv)} exited {rc}")
        return out[:GIT_OUTPUT_LIMIT].decode("utf-8", "surrogateescape")

    def git(self, *args: str, gate: str = "checkout") -> str:
        """A read-only git command on the checkout (its output parsed here, logged only when it fails)."""
        return self.run(["git", "-C", self.path(CHECKOUT), *GIT_OPTIONS, *args], gate, self.base, _git_env(),
                        quiet=True)  # fmt: skip

    # ----------------------------------------------------------------- files

    def file_state(self, entry: dict[str, Any]) -> str:
        """`present` (regular, right hash) or `missing`; anything else fails the `verify file` gate."""
        where = self.path(entry["name"])
        if not os.path.lexists(where):
            return "missing"
        _real_dirs(self.base, os.path.dirname(where), "verify file")
        if _sha256(where, entry["name"], "verify file", entry["size"]) != entry["sha256"]:
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
            target = self.path(name)
            temp = self.path(f".{name.replace('/', '_')}.part-{os.getpid()}")
            self.temps.append(temp)
            digest = hashlib.sha256()
            with _naming(target):
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
            _make_dirs(os.path.dirname(target), self.base, "verify file")
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
            _make_dirs(os.path.dirname(target), checkout, "place file", CHECKOUT)
            if os.path.lexists(target):
                self.verify_placed(entry, "place file")
                continue
            temp = f"{target}.part-{os.getpid()}"
            self.temps.append(temp)
            with _naming(target):
                _copy_new(self.path(entry["name"]), temp, entry["name"])
            os.link(temp, target)
            os.unlink(temp)
            self.temps.remove(temp)

    def verify_placed(self, entry: dict[str, Any], gate: str) -> None:
        target = os.path.join(self.path(CHECKOUT), entry["install_to"])
        shown = f"{CHECKOUT}/{entry['install_to']}"
        _real_dirs(self.path(CHECKOUT), os.path.dirname(target), gate, CHECKOUT)
        if not os.path.lexists(target):
            raise GateFailure(gate, f"{shown}: missing")
        if entry.get("keep_if_present"):  # the operator may edit it after install (the router's effective fleet)
            _regular(os.lstat(target), shown, gate)
            return
        if _sha256(target, shown, gate, entry["size"]) != entry["sha256"]:
            raise GateFailure(gate, f"{shown}: content differs from the manifest (left as it is)")
        self.verified += 1

    # ----------------------------------------------------------------- checkout and environment

    def clone(self) -> None:
        """Clone the bundle into a temporary directory and rename it: a cut connection leaves no half checkout."""
        checkout = self.path(CHECKOUT)
        if os.path.lexists(checkout):
            _real_dir(checkout, CHECKOUT, "checkout")
            return
        temp = self.path(f"{CHECKOUT}.part-{os.getpid()}")
        self.temps.append(temp)
        env = _git_env()  # no global config (its hooksPath, templateDir); --no-checkout runs no hook
        clone = ["git", "clone", "--quiet", "--no-checkout", "--", self.path(BUNDLE), temp]
        self.run(clone, "checkout", self.base, env)
        self.run(["git", "-C", temp, *GIT_OPTIONS, "checkout", "--quiet", "--detach", self.revision], "checkout",
                 self.base, env)  # fmt: skip
        os.rename(temp, checkout)
        self.temps.remove(temp)

    def verify_checkout(self) -> None:
        """HEAD is the revision, the index is the revision's tree with no flag that hides a change, and every
        tracked file's content (hashed here, not by git's stat cache) is the revision's blob."""
        _real_dir(self.path(CHECKOUT), CHECKOUT, "checkout")
        head = self.head()
        if head != self.revision:
            raise GateFailure("checkout", f"{CHECKOUT}: HEAD is {head[:80]}, not the approved revision")
        listing = self.git("ls-tree", "-r", "-z", "--full-tree", self.revision)
        tree = {path: entry[1:] for path, entry in _git_entries(listing, tagged=False).items()}
        index = _git_entries(self.git("ls-files", "-s", "-v", "-z"), tagged=True)
        for path, (tag, mode, oid) in sorted(index.items()):
            if tag.islower() or tag == "S":
                raise GateFailure("checkout", f"{CHECKOUT}/{_printable_path(path)}: marked assume-unchanged or "
                                  "skip-worktree in the index, which hides changes (left as it is)")  # fmt: skip
            if tag != "H" or tree.get(path) != [mode, oid]:
                raise GateFailure("checkout", DIFFER)
        if len(index) != len(tree):
            raise GateFailure("checkout", DIFFER)
        checkout = self.path(CHECKOUT)
        checked = set()  # each directory is checked once, not once per file in it
        for path, (mode, oid) in sorted(tree.items()):
            parent = os.path.dirname(path)
            if parent not in checked:
                _real_dirs(checkout, os.path.join(checkout, parent), "checkout", CHECKOUT)
                checked.add(parent)
            if mode != "160000" and _blob_id(checkout, path, mode, len(oid)) != oid:
                raise GateFailure("checkout", DIFFER)

    def head(self) -> str:
        """The commit HEAD names: `.git/HEAD` itself when it holds the revision (a detached HEAD, as `clone`
        leaves it: one git process fewer per verification), else what `git rev-parse` resolves (a branch, a
        linked worktree's `.git` file, another commit), which then names it in the gate's message."""
        git_dir = self.path(CHECKOUT, ".git")
        if _is_real_dir(git_dir):
            with contextlib.suppress(GateFailure):  # not a regular file: git judges it
                found = _read_small(os.path.join(git_dir, "HEAD"), "HEAD", "checkout", MARKER_LIMIT) or b""
                text = found.decode("ascii", "replace")
                if text == f"{self.revision}\n":
                    return text.strip()
        return self.git("rev-parse", "--verify", "HEAD").strip()

    def environment(self) -> dict[str, str]:
        venv = self.path(CHECKOUT, VENV)
        env = dict(os.environ)
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env.pop("PYTHONHOME", None)
        return env

    def venv_problem(self) -> str | None:
        """What keeps `checkout/.venv` from being what a completed `python -m venv` leaves (None: complete).

        `python -m venv` writes pyvenv.cfg and bin/python first, then pip, then bin/activate: a host killed or
        out of disk in between leaves a bin/python that proves nothing.
        """
        venv = self.path(CHECKOUT, VENV)
        if not os.path.lexists(venv):
            return "missing"
        _real_dir(venv, f"{CHECKOUT}/{VENV}", "venv")
        for name in ("bin", "lib"):
            if not _is_real_dir(os.path.join(venv, name)):
                return f"no {name}/ directory"
        for name in ("pyvenv.cfg", os.path.join("bin", "activate")):
            if not _is_regular(os.path.join(venv, name)):
                return f"no {name}"
        if not os.path.exists(os.path.join(venv, "bin", "python")):  # venv's own symlink to the interpreter
            return "no bin/python"
        lib = os.path.join(venv, "lib")
        with os.scandir(lib) as entries:
            versions = [e.name for e in itertools.islice(entries, ENTRY_LIMIT) if e.name.startswith("python")]
        for version in versions:
            packages = os.path.join(lib, version, "site-packages")
            if _is_real_dir(os.path.join(lib, version)) and _is_real_dir(packages) and \
                    _is_regular(os.path.join(packages, "pip", "__init__.py")):  # fmt: skip
                return None
        return "pip is not installed in it"

    def require_venv(self) -> None:
        problem = self.venv_problem()
        if problem is not None:
            raise GateFailure("venv", f"{CHECKOUT}/{VENV} is incomplete ({problem}): run the install again")

    def venv_and_commands(self) -> None:
        """Create `.venv` unless it is complete (a half-made one is removed and rebuilt), verify the result,
        then run the install and check commands in it."""
        checkout = self.path(CHECKOUT)
        problem = self.venv_problem()
        if problem is not None:
            if problem != "missing":
                _rmtree(os.path.join(checkout, VENV))
            self.run([sys.executable, "-m", "venv", VENV], "venv", checkout)
            problem = self.venv_problem()
            if problem is not None:
                raise GateFailure("venv", f"{CHECKOUT}/{VENV}: incomplete after python -m venv ({problem})")
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
                self.verify_placed(entry, "verify file")

    def marker(self) -> str | None:
        data = _read_small(self.path(MARKER), MARKER, "marker", MARKER_LIMIT)
        return None if data is None else data.decode("ascii", "replace")

    def write_marker(self) -> None:
        """The file set first, the marker last: a marker always comes with the file set it was written for."""
        self.write_atomic(FILE_SET, files_sha256(self.files) + "\n")
        self.write_atomic(MARKER, self.revision + "\n")

    def write_atomic(self, name: str, text: str) -> None:
        temp = self.path(f".{name}.part-{os.getpid()}")
        self.temps.append(temp)
        with _naming(self.path(name)):
            _write_new(temp, text.encode("ascii"))
        os.rename(temp, self.path(name))
        self.temps.remove(temp)

    def check_current(self) -> None:
        """`current` is absent or a symlink to a deployment directory here; anything else (a file, a directory,
        a dangling link, a link out of the deployment root) would stop activation, so staging stops on it."""
        where = os.path.join(self.top, CURRENT)
        try:
            info = os.lstat(where)
        except FileNotFoundError:
            return
        if not stat.S_ISLNK(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a symlink"
            raise GateFailure("current", f"{CURRENT} is {kind}, not a link to a deployment (left as it is)")
        target = os.readlink(where)
        if not _deployment_id(target):
            raise GateFailure("current", f"{CURRENT} points at {_printable_path(target)}, not at a deployment "
                              "directory here (left as it is)")  # fmt: skip
        if not _is_real_dir(os.path.join(self.top, target)):
            raise GateFailure("current", f"{CURRENT} points at {target}, which is not a deployment directory here "
                              "(a dangling link; left as it is)")  # fmt: skip

    def move_current(self) -> None:
        """Point `current` at this deployment: a new symlink renamed over the old one (atomic)."""
        where = os.path.join(self.top, CURRENT)
        self.check_current()
        temp = os.path.join(self.top, f"{CURRENT}.part-{os.getpid()}")
        self.temps.append(temp)
        os.symlink(os.path.basename(self.base), temp)
        os.rename(temp, where)
        self.temps.remove(temp)

    # ----------------------------------------------------------------- lock

    def lock(self) -> None:
        """Take `.install-lock` for this installer, or fail the `lock` gate naming who holds it.

        Everything that makes, judges or takes over the lock happens under an exclusive `flock` of the
        deployment directory (`lock_guard`), so no two installers of this version do it at once. The lock is
        made complete or not at all (`make_lock`): a held lock always holds its owner record. A stale lock
        (`take_over`) is renamed to a name of this installer's own (gone at once for every racer), its dead
        owner's leftovers removed, and a fresh lock made; then the lock directories a killed installer left
        under other names (`.install-lock.new-*`, `.stale-*`, `.done-*`) are removed."""
        where = self.path(LOCK)
        mine = {"pid": os.getpid(), "start": start_ticks(os.getpid()), "boot": boot_id(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": self.params.get("owner", ""),
                "token": os.urandom(16).hex()}  # fmt: skip
        with self.lock_guard():
            if not self.make_lock(where, mine):
                self.take_over(where, mine["token"])
                if not self.make_lock(where, mine):  # an older installer (no guard) made one meanwhile
                    raise GateFailure("lock", f"{LOCK} is held by {_describe_owner(_read_owner(where))}")
            self.remove_lock_leftovers()

    def make_lock(self, where: str, mine: dict[str, Any]) -> bool:
        """Make the lock complete or not at all; False when `where` exists. A directory of this installer's
        own (`.install-lock.new-<token>`) gets the owner record, flushed to disk, then is renamed to
        `.install-lock`: a kill at any point leaves either no lock or a complete one (and maybe that
        temporary directory, which `remove_lock_leftovers` deletes later). `rename` never replaces a lock
        made meanwhile: a lock is never an empty directory, and a non-empty one (or a non-directory) makes
        it fail."""
        if os.path.lexists(where):
            return False
        temp = self.path(f"{LOCK}.new-{mine['token']}")
        os.mkdir(temp, 0o700)
        try:
            with _naming(os.path.join(where, LOCK_OWNER)):
                _write_new(os.path.join(temp, LOCK_OWNER), json.dumps(mine).encode("ascii"))
                _fsync_dir(temp)
            self.lock_owner = mine  # before the rename: a signal right after it still releases the lock
            try:
                os.rename(temp, where)
            except OSError as exc:
                self.lock_owner = None
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    return False
                raise
            return True
        finally:
            _remove_lock_dir(self.base, os.path.basename(temp))  # gone already once renamed

    @contextlib.contextmanager
    def lock_guard(self):  # type: ignore[no-untyped-def]
        """An exclusive `flock` of the deployment directory itself (released by the kernel if we die), waited
        for at most LOCK_WAIT_S: its holders only make, judge or remove lock directories."""
        fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if not flock_within(fd, LOCK_WAIT_S):
                raise GateFailure("lock", f"{LOCK}: another installer kept the deployment directory's flock for "
                                  f"{LOCK_WAIT_S:.0f} s")  # fmt: skip
            yield
        finally:
            os.close(fd)

    def take_over(self, where: str, token: str) -> None:
        """Remove the stale lock at `where` (nothing when it is gone), saying so in the report's notes; a held
        lock, or a symlink or non-directory there, fails the `lock` gate and is left as it is."""
        verdict, owner, why = _judge_lock(where)
        if verdict == "absent":
            return
        if verdict != "stale":
            raise GateFailure("lock", why)
        gone = f"{LOCK}.stale-{token}"
        try:
            os.rename(where, self.path(gone))
        except FileNotFoundError:  # its owner released it meanwhile (`unlock` renames it away without the guard)
            return
        if owner is not None:
            self.discard_leftovers(owner)
        _remove_lock_dir(self.base, gone)
        self.notes.append(f"{why}: taken over")

    def unlock(self) -> None:
        """Remove the lock only while its owner record is this installer's: never one taken over or replaced.
        It is renamed away first (gone at once: `.install-lock` is never an empty directory), then deleted."""
        if self.lock_owner is None:
            return
        where = self.path(LOCK)
        if _read_owner(where) == self.lock_owner:
            gone = f"{LOCK}.done-{self.lock_owner['token']}"
            with contextlib.suppress(OSError):
                os.rename(where, self.path(gone))
                _remove_lock_dir(self.base, gone)
        self.lock_owner = None

    def remove_lock_leftovers(self) -> None:
        """Delete the lock directories killed installers left under their own names: `.install-lock.new-*`
        (killed while making the lock), `.stale-*` (while taking one over), `.done-*` (while releasing one).
        Called under `lock_guard`, so no live installer of this version is making or taking over a lock: none
        of them is a lock or will become one. A stale lock renamed away by a taker killed before it finished
        still has its dead owner's leftovers removed first. Only real directories holding nothing but regular
        files are deleted (no symlink followed); anything else is left as it is."""
        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(self.base) as entries:
            names = [e.name for e in itertools.islice(entries, ENTRY_LIMIT) if _lock_leftover(e.name)]
        for name in names:
            owner = _read_owner(self.path(name)) if name.startswith(f"{LOCK}.stale-") else None
            if owner is not None and not _process_alive(owner):
                self.discard_leftovers(owner)
        removed = sum(_remove_lock_dir(self.base, name) for name in names)
        if removed:
            self.notes.append(f"removed {removed} lock director{'y' if removed == 1 else 'ies'} left by killed "
                              "installers")  # fmt: skip

    def discard_leftovers(self, owner: dict[str, Any]) -> None:
        """Remove what the dead owner of a stale lock left half-made: names ending in `.part-<its pid>`, only
        in directories reached from the deployment directory without a symlink."""
        pid = owner.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            return
        checkout = self.path(CHECKOUT)
        places = {self.base} | {os.path.dirname(os.path.join(checkout, e["install_to"]))
                                for e in self.files if e.get("install_to")}  # fmt: skip
        for place in places:
            try:
                _real_dirs(self.base, place, "lock")
            except GateFailure:
                continue  # a symlink on the way: what is behind it is not ours
            with contextlib.suppress(OSError), os.scandir(place) as entries:
                self.temps += [e.path for e in entries if e.name.endswith(f".part-{pid}")]
        self.cleanup()

    def cleanup(self) -> None:
        for temp in self.temps:
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(temp).st_mode):
                    _rmtree(temp, ignore_errors=True)
                else:
                    os.unlink(temp)
        self.temps = []

    # ----------------------------------------------------------------- actions

    def inspect(self) -> str:
        _real_dirs(self.home, self.base, "directory")
        if self.lease_mode == "acquire":
            self.take_lease()
        self.check_current()
        if not os.path.lexists(self.base):
            self.states = {e["name"]: "missing" for e in self.files}
            return "absent"
        found = self.marker()
        if found is None:
            self.verify_files(require=False)
            return "incomplete"
        self.require_marker(found)
        self.verify_all()
        # complete but for the virtualenv (removed or broken since): `install` rebuilds it and marks it again
        return "reused" if self.venv_problem() is None else "incomplete"

    def require_marker(self, found: str | None) -> None:
        if found is None:
            raise GateFailure("marker", f"{MARKER}: missing (the install did not complete)")
        if found != self.revision + "\n":
            raise GateFailure("marker", f"{MARKER} names another revision (left as it is)")

    def install(self) -> str:
        _real_dirs(self.home, self.base, "directory")
        self.take_lease()
        self.check_current()
        _make_dirs(self.base, self.home, "directory")
        self.lock()
        self.receive()
        self.verify_files(require=True)
        self.clone()
        self.verify_checkout()
        self.place()
        self.venv_and_commands()
        self.verify_all()  # the commands changed no tracked or placed file
        self.require_venv()
        with self.fenced():
            self.write_marker()
        return "staged"  # complete and verified; `activate` moves `current`

    def activate(self) -> str:
        _real_dirs(self.home, self.base, "directory")
        _real_dir(self.base, os.path.relpath(self.base, self.home), "directory")
        self.take_lease()
        self.lock()
        self.require_marker(self.marker())
        self.verify_all()
        self.require_venv()
        with self.fenced():
            self.move_current()
        return "activated"

    def status(self) -> str:
        self.detail = {"current": None, "deployments": [], "truncated": False}
        _real_dirs(self.home, self.top, "directory")
        if not os.path.lexists(self.top):
            return "listed"
        self.detail["current"] = _current_target(self.top)
        known = self.params.get("known", {})
        with os.scandir(self.top) as entries:
            for count, entry in enumerate(entries):
                if count >= ENTRY_LIMIT:
                    self.detail["truncated"] = True
                    break
                if entry.name != CURRENT and not entry.name.startswith("."):  # the lease, leftovers
                    self.detail["deployments"].append(self.describe(entry.name, known.get(entry.name)))
        self.detail["deployments"].sort(key=lambda d: d["name"])
        return "listed"

    def describe(self, name: str, known: dict[str, Any] | None) -> dict[str, Any]:
        """One entry of the base directory; a foreign name or a non-directory is never read."""
        where = os.path.join(self.top, name)
        found: dict[str, Any] = {"name": name[:64], "state": "foreign", "revision": None, "file_set": None,
                                 "installed_at": None, "check": "unknown", "problem": None}  # fmt: skip
        if not _deployment_id(name) or not _is_real_dir(where):
            return found
        known = known or {}
        one = Installer({"remote_dir": os.path.relpath(where, self.home), "revision": known.get("revision", ""),
                         "files": known.get("files", [])})  # fmt: skip
        try:
            marker = one.marker()
            file_set = _read_small(os.path.join(where, FILE_SET), FILE_SET, "marker", FILE_SET_LIMIT)
        except GateFailure as failure:
            return {**found, "state": "incomplete", "check": "tampered", "problem": failure.message}
        found["file_set"] = file_set.decode("ascii", "replace").strip()[:64] if file_set is not None else None
        found["revision"] = marker.strip()[:64] if marker else None
        found["installed_at"] = os.lstat(os.path.join(where, MARKER)).st_mtime if marker else None
        if _judge_lock(os.path.join(where, LOCK))[0] == "held":  # an install in progress (or a symlink)
            return {**found, "state": "locked"}
        found["state"] = "installed" if marker else "incomplete"
        if not known or marker is None:
            return found
        try:
            if found["file_set"] not in (None, files_sha256(one.files)):
                raise GateFailure("marker", f"{FILE_SET}: names another file set")
            one.require_marker(marker)
            one.verify_all()
            one.require_venv()
        except GateFailure as failure:
            return {**found, "check": "tampered", "problem": failure.message}
        return {**found, "check": "intact"}

    def prune(self) -> str:
        """Remove each named deployment, re-checked here: never `current`'s target, never a locked one."""
        _real_dirs(self.home, self.top, "directory")
        self.take_lease()
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
        if not _is_real_dir(self.top):
            return 0
        with os.scandir(self.top) as entries:
            names = [e.name for e in itertools.islice(entries, ENTRY_LIMIT) if e.name.startswith(".removing-")]
        for name in names:
            pid = name.rsplit("-", 1)[-1]
            if pid.isdigit() and not start_ticks(int(pid)) and _is_real_dir(os.path.join(self.top, name)):
                _rmtree(os.path.join(self.top, name), ignore_errors=True)
                count += 1
        return count

    def remove(self, name: str) -> str | None:
        """Why `name` stays, or None once it is gone."""
        where = os.path.join(self.top, name)
        if not _deployment_id(name) or not _is_real_dir(where):
            return "not a deployment directory here"
        one = Installer({"remote_dir": os.path.relpath(where, self.home)})
        try:
            one.lock()
        except GateFailure as failure:
            return failure.message
        finally:
            self.notes += [f"{name}: {note}" for note in one.notes]
        try:
            gone = os.path.join(self.top, f".removing-{name}-{os.getpid()}")
            with self.fenced():
                if _current_target(self.top) == name:
                    return "current points at it"
                os.rename(where, gone)
            one.lock_owner = None  # the lock went with the directory
        finally:
            one.unlock()
        _rmtree(gone)
        return None


# --------------------------------------------------------------------- file system helpers

DIFFER = f"{CHECKOUT}: tracked files differ from the revision (left as they are)"


def files_sha256(files: list[Any]) -> str:
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


def _show(argv: list[str]) -> str:
    return " ".join(str(a) for a in argv)[:200]


def _printable_path(path: str) -> str:
    if path.isascii() and path.isprintable():  # the common case, without a loop over its characters
        return path[:200]
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in path)[:200]


def _git_env() -> dict[str, str]:
    """The environment git runs in: no inherited GIT_* variable, no system or global configuration (HOME
    and XDG_CONFIG_HOME name no directory, for a git older than GIT_CONFIG_GLOBAL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_ENV, HOME=os.devnull, XDG_CONFIG_HOME=os.devnull)
    return env


def _git_entries(text: str, tagged: bool) -> dict[str, list[str]]:
    """`git ls-tree -r -z` (`mode type oid\\tpath`) or `git ls-files -s -v -z` (`tag mode oid stage\\tpath`) as
    path -> [tag, mode, oid]; a conflict stage (not 0) is a difference."""
    entries = {}
    for record in filter(None, text.split("\0")):
        head, _, path = record.partition("\t")
        fields = head.split(" ")
        if tagged:
            if len(fields) != 4 or fields[3] != "0":
                raise GateFailure("checkout", DIFFER)
            entries[path] = [fields[0], fields[1], fields[2]]
        elif len(fields) == 3:
            entries[path] = ["", fields[0], fields[2]]
    return entries


def _blob_id(root: str, path: str, mode: str, hex_length: int) -> str:
    """The git blob id of the working file `path` below `root` (a symlink's target for mode 120000), itself not
    followed (the caller checked its directories); "" when it is missing or of another kind or executable bit
    than `mode`."""
    where = os.path.join(root, path)
    try:
        info = os.lstat(where)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    digest = hashlib.sha256() if hex_length == 64 else hashlib.sha1()  # noqa: S324 (git's object id, not security)
    if mode == "120000":
        if not stat.S_ISLNK(info.st_mode):
            return ""
        target = os.fsencode(os.readlink(where))
        digest.update(b"blob %d\0" % len(target) + target)
        return digest.hexdigest()
    if not stat.S_ISREG(info.st_mode) or bool(info.st_mode & 0o100) != (mode == "100755"):
        return ""
    fd, opened = _open_regular(where, f"{CHECKOUT}/{_printable_path(path)}", "checkout")
    digest.update(b"blob %d\0" % opened.st_size)
    _feed(fd, opened.st_size, digest)
    return digest.hexdigest()


def _kind(info: os.stat_result) -> str:
    return "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"


def _real_dir(path: str, shown: str, gate: str) -> None:
    """`path` exists and is a directory itself, not a symlink to one."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise GateFailure(gate, f"{shown} is {_kind(info)} (left as it is)")


def _real_dirs(root: str, path: str, gate: str, shown_root: str = "") -> None:
    """Each existing component of `path` below `root` (`path` included) is a real directory, never a symlink:
    nothing this program touches is reached through a link it did not make. Missing components are fine."""
    relative = os.path.relpath(path, root)
    current, shown = root, shown_root
    for part in [] if relative == "." else relative.split(os.sep):
        current, shown = os.path.join(current, part), os.path.join(shown, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(info.st_mode):
            raise GateFailure(gate, f"{shown} is {_kind(info)} (left as it is)")


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _open_regular(path: str, shown: str, gate: str) -> tuple[int, os.stat_result]:
    """An fd open for reading on `path`, which must be a regular file: opened without following a symlink
    and without blocking (a FIFO would otherwise wait for a writer), then checked by `fstat`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise GateFailure(gate, f"{shown} is a symlink (left as it is)") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise GateFailure(gate, f"{shown} is not a regular file (left as it is)")
    return fd, info


def _read_small(path: str, shown: str, gate: str, limit: int) -> bytes | None:
    """At most `limit` bytes of the regular file `path`; None when it does not exist."""
    try:
        fd, _ = _open_regular(path, shown, gate)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit)


def _sha256(path: str, shown: str, gate: str, size: int) -> str:
    """The SHA-256 of the regular file `path`; "" when its size is not `size` (nothing more is read)."""
    fd, info = _open_regular(path, shown, gate)
    if info.st_size != size:
        os.close(fd)
        return ""
    digest = hashlib.sha256()
    _feed(fd, size, digest)
    return digest.hexdigest()


def _feed(fd: int, size: int, digest: Any) -> None:
    """Hash the open file `fd` (`size` bytes by its `fstat`) to its end, then close it. Reads are sized to the
    file, at most CHUNK: a 1 MiB read of a small file costs a fresh mapping and its page faults, which took
    more of a host's CPU than hashing the few hundred files of a checkout."""
    try:
        block = min(CHUNK, size + 1)  # one read of the whole file, one more that finds its end
        while data := os.read(fd, block):
            digest.update(data)
    finally:
        os.close(fd)


def _rmtree(path: str, ignore_errors: bool = False) -> None:
    """`shutil.rmtree`, imported only when something is removed: `shutil` loads zlib, bz2 and lzma, about 4 ms
    of a host's CPU on every call of this program, and most calls (`status`, a reuse) remove nothing."""
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def _write_new(path: str, data: bytes) -> None:
    """Create `path` (never an existing name or a symlink) with `data`, flushed to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _copy_new(source: str, target: str, shown: str) -> None:
    """Copy the regular file `source` to the new file `target` (0600)."""
    fd, _ = _open_regular(source, shown, "place file")
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "rb") as handle, os.fdopen(out, "wb") as copy:
        for block in iter(lambda: handle.read(CHUNK), b""):
            copy.write(block)
        copy.flush()
        os.fsync(copy.fileno())


@contextlib.contextmanager
def _naming(path: str):  # type: ignore[no-untyped-def]
    """An OSError inside that names no file (a write that hit a full disk) names `path`."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = path
        raise


def _regular(info: os.stat_result, shown: str, gate: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise GateFailure(gate, f"{shown} is a symlink (left as it is)")
    if not stat.S_ISREG(info.st_mode):
        raise GateFailure(gate, f"{shown} is not a regular file (left as it is)")


def _make_dirs(path: str, top: str, gate: str, shown_top: str = "") -> None:
    """Create `path` below `top` (0700 each); every existing component must be a real directory."""
    relative = os.path.relpath(path, top)
    current, shown = top, shown_top
    for part in [] if relative == "." else relative.split(os.sep):
        current, shown = os.path.join(current, part), os.path.join(shown, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            info = os.lstat(current)
            if not stat.S_ISDIR(info.st_mode):
                raise GateFailure(gate, f"{shown} is {_kind(info)} (left as it is)") from None


def _stop_tree(proc: subprocess.Popen[bytes]) -> bytes:
    """Kill a command that ran out of time and every process it started (they hold its output pipe), then
    collect what it printed; a process that escaped (a new session) cannot keep this program waiting."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        out = b""
        proc.stdout.close()  # type: ignore[union-attr]
        proc.wait()
    return out or b""


def _descendants(root: int) -> list[int]:
    """Every process below `root` (from /proc: each process's parent id)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as handle:
                    parents[int(name)] = int(handle.read(4096).rsplit(b")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def boot_id() -> str:
    """This boot's id: a pid recorded under another boot names no process now (also read by the workstation)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> str:
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


def _read_owner(lock_dir: str) -> dict[str, Any] | None:
    """The lock's owner record; None when the lock is not a real directory or the record is not a regular
    file holding a JSON object (a FIFO is never waited on)."""
    if not _is_real_dir(lock_dir):
        return None
    try:
        data = _read_small(os.path.join(lock_dir, LOCK_OWNER), LOCK_OWNER, "lock", OWNER_LIMIT)
        owner = json.loads(data or b"null")
    except (GateFailure, OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _judge_lock(where: str) -> tuple[str, dict[str, Any] | None, str]:
    """What the lock at `where` is: ("absent", None, ""), ("held", owner or None, why) or ("stale", owner or
    None, why). Held: its owner process runs, or it has no readable owner record and changed less than
    OWNERLESS_STALE_S ago in this boot, or it is a symlink or not a directory (left as it is, never read).
    Stale: its owner is gone, or it has had no readable owner record for longer."""
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        return "absent", None, ""
    if not stat.S_ISDIR(info.st_mode):
        return "held", None, f"{LOCK} is {_kind(info)} (left as it is)"
    owner = _read_owner(where)
    if owner is not None:
        if _process_alive(owner):
            return "held", owner, f"{LOCK} is held by {_describe_owner(owner)}"
        return "stale", owner, f"{LOCK} of {_describe_owner(owner)} was stale (that process is gone)"
    age = time.time() - info.st_mtime
    if info.st_mtime < boot_time():
        since = "since before this boot"
    elif age > OWNERLESS_STALE_S:
        since = f"for {age:.0f} s"
    else:
        return "held", None, f"{LOCK} is held by {_describe_owner(None)}"
    return "stale", None, f"{LOCK} had no readable {LOCK_OWNER} {since} (an installer killed while making it)"


def _lock_leftover(name: str) -> bool:
    """`.install-lock.new-<token>`, `.stale-<token>` or `.done-<token>`: a lock directory under another name."""
    kind, _, token = name[len(LOCK) + 1 :].partition("-") if name.startswith(LOCK + ".") else ("", "", "")
    return kind in ("new", "stale", "done") and len(token) == 32 and all(c in "0123456789abcdef" for c in token)


def _remove_lock_dir(parent: str, name: str) -> bool:
    """Delete the directory `name` in `parent` if it holds nothing but regular files (a lock's owner record,
    an older installer's `.owner.json.part`): opened by `dir_fd` without following a symlink, each entry
    `lstat`ed there. False, leaving it as it is, when it is missing, a symlink, not a directory, or holds
    anything else; another process deleting it at the same time is fine."""
    try:
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
        try:
            names = os.listdir(fd)
            if len(names) > ENTRY_LIMIT:
                return False
            for entry in names:
                with contextlib.suppress(FileNotFoundError):
                    if not stat.S_ISREG(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                        return False
            for entry in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=top)
        return True
    except OSError:
        return False
    finally:
        os.close(top)


def _fsync_dir(path: str) -> None:
    """Flush a directory's entries to disk (where the file system can)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def boot_time() -> float:
    """When this boot began (seconds since the epoch, `btime` of /proc/stat); 0 when unknown."""
    try:
        with open("/proc/stat", "rb") as handle:  # after the per-CPU and interrupt lines, however long
            for line in handle:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _process_alive(owner: dict[str, Any] | None) -> bool:
    """Whether the lock's owner still runs: same boot, and its pid is the same process (start time matches).

    No owner record (None), or one without a pid, holds: `_judge_lock` decides when such a lock is stale.
    """
    if owner is None:
        return True
    if owner.get("boot") and owner.get("boot") != boot_id():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return True
    now = start_ticks(pid)
    return bool(now) and (not owner.get("start") or now == owner.get("start"))


def _describe_owner(owner: dict[str, Any] | None) -> str:
    if owner is None:
        return f"an unknown owner (no readable {LOCK_OWNER})"
    by = str(owner.get("by", "?"))[:200]
    return f"{by} (pid {owner.get('pid', '?')}) since {owner.get('since', '?')}"


@contextlib.contextmanager
def _lease_gate():  # type: ignore[no-untyped-def]
    """A refused lease is this host's `lease` gate."""
    try:
        yield
    except LeaseRefused as refused:
        holder = refused.holder or {}
        who = f" ({holder.get('user', '?')}@{holder.get('workstation', '?')}, {holder.get('command', '?')})" \
            if refused.holder and "taken over" not in refused.message else ""
        raise GateFailure("lease", f"lease: {refused.message}{who}") from None


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
        with contextlib.suppress(GateFailure):  # never read through a symlinked `Narwhal-deploy`
            _real_dirs(installer.home, installer.top, "directory")
            report["current"] = _current_target(installer.top)
    try:
        report["outcome"] = getattr(installer, params["action"])()
        installer.end_lease(report["outcome"], report.get("current"))
    except GateFailure as failure:
        report.update(outcome="failed", gate=failure.gate, message=failure.message)
    except _Stop:
        report.update(outcome="failed", gate="interrupted", message="the installer was stopped by a signal")
    except OSError as exc:  # the file it happened to, relative to the deployment directory, else the action
        shown = os.path.relpath(exc.filename, installer.base) if exc.filename else params["action"]
        report.update(outcome="failed", gate="io", message=f"{shown}: {exc.strerror}")
    finally:
        installer.cleanup()
        installer.unlock()
        if report.get("outcome") == "failed":
            installer.end_lease("failed", None)
        _drain_stdin()
    if installer.lease is not None:
        report["lease"] = installer.lease.detail
    if installer.notes:
        report["notes"] = [note[:500] for note in installer.notes[:ENTRY_LIMIT]]
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

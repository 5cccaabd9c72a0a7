"""Per-host deploy lease: runs on every host a fleet operation changes, alone or within the installer.

Standard library only, Python 3.8+, ASCII source. An operation (install, rollback, prune) holds a lease on
each host it changes: `~/<base>/.lease`, one JSON record naming the holder (user, workstation, command,
revision, deployment id, message, its process), the SHA-256 of the operation's token (the token itself never
leaves the workstation's memory and this process) and when the lease expires on the host's own clock.

Every read and change of the record, and every state change the lease protects, happens under an exclusive
`flock` of `~/<base>` itself, waited for at most GUARD_WAIT_S (a holder that never lets go stops this host
with a line, never a hang). The record is written to `.lease.part-<pid>` and renamed into place, so it is
there whole or not at all; a writer killed before the rename leaves only that name, which the next taker
(under the guard, so no live writer is behind it) removes.

Actions (`lease_main`; the installer calls the same methods before its own action):
- `acquire`: no record, an expired one, ours (renewed), or one whose operation the workstation proved gone
  (`holder_gone`: same workstation, boot, pid and operation id, no longer running): write ours; anyone else's live
  record refuses, naming the holder. A record that is not ours to judge (a symlink, FIFO, directory,
  someone else's file, oversized or unparsable) refuses too, saying exactly what is there.
- `renew`: ours only (fencing: a record that names another token means the lease was taken over).
- `release`: ours only; `release_dead`: anyone's once expired or proven gone; `clear` (`--release --force`):
  whatever is at the record's name and the half-made leftovers, never following a link.
- `show`: what is there, read-only.
Fencing: `HostLease.fenced()` holds the guard while the caller makes its change (the `current` switch, the
completion marker, a prune's rename) after checking that the record still names the operation's token.
"""

# No `from __future__` import: on a host this source follows the installer's in one program, where such an
# import must come first. Annotations that Python 3.8 cannot evaluate are quoted.
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import time

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` on the host
if TYPE_CHECKING:  # annotations only: hosts may run Python 3.8
    from collections.abc import Iterator
    from typing import Any

LEASE_SCHEMA = "narwhal.host-lease"
LEASE_REPORT_SCHEMA = "narwhal.lease-report"
LEASE = ".lease"
PART = LEASE + ".part-"
OLD_FLEET_LOCK = ".fleet-lock"  # the one-host fleet lock of earlier versions: shown, and removed by `clear`
GUARD_WAIT_S = 10.0
RECORD_LIMIT = 16 * 1024  # far above any record this program writes (its fields are bounded by the workstation)
LEFTOVER_LIMIT = 64
LEASE_ACTIONS = ("acquire", "renew", "release", "release_dead", "clear", "show")
HOLDER_FIELDS = ("user", "workstation", "command", "revision", "deployment_id", "message", "since", "boot",
                 "pid", "pid_start", "operation")  # fmt: skip
PROCESS_FIELDS = ("workstation", "boot", "pid", "pid_start", "operation")  # what `holder_gone` names


class LeaseRefused(Exception):
    """This host's lease is not the operation's (held by another, taken over, unreadable); `holder` if known."""

    def __init__(self, message: str, holder: "dict[str, Any] | None" = None) -> None:
        super().__init__(message)
        self.message = message
        self.holder = holder


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


class HostLease:
    """The lease record under `~/<base>`; `params`: token, holder, lease_s, holder_gone."""

    def __init__(self, home: str, base: str, params: "dict[str, Any]") -> None:
        self.home = home
        self.top = os.path.join(home, base)
        self.shown_top = base
        self.where = os.path.join(self.top, LEASE)
        self.token = str(params.get("token") or "")
        self.holder = params.get("holder") or {}
        self.lease_s = float(params.get("lease_s") or 300.0)
        self.gone = params.get("holder_gone")
        self.guard_wait_s = float(params.get("guard_wait_s") or GUARD_WAIT_S)
        self.detail: dict[str, Any] = {"state": "absent", "holder": None, "expires_in": None, "problem": None,
                             "leftovers": [], "broken": None, "released": False}  # fmt: skip

    # ----------------------------------------------------------------- guard

    @contextlib.contextmanager
    def guard(self) -> "Iterator[None]":
        """The exclusive `flock` of `~/<base>` (made 0700 if missing, never through a symlink)."""
        self.base_dir()
        fd = os.open(self.top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if not flock_within(fd, self.guard_wait_s):
                raise LeaseRefused(f"~/{self.shown_top} stayed locked (flock) by another process for "
                                   f"{self.guard_wait_s:.0f} s")  # fmt: skip
            yield
        finally:
            os.close(fd)

    def base_dir(self) -> None:
        try:
            info = os.lstat(self.top)
        except FileNotFoundError:
            os.mkdir(self.top, 0o700)
            return
        if not stat.S_ISDIR(info.st_mode):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
            raise LeaseRefused(f"~/{self.shown_top} is {kind} (left as it is)")

    # ----------------------------------------------------------------- reading

    def read(self) -> "dict[str, Any] | None":
        """The record (None when there is none); anything that is not a record we wrote raises LeaseRefused
        saying what is there. Also lists half-made leftovers in `detail`."""
        self.detail["leftovers"] = self.leftovers()
        try:
            info = os.lstat(self.where)
        except FileNotFoundError:
            self.detail["state"] = "absent"
            return None
        problem = self.problem(info)
        if problem is None:
            record = self.parse()
            if isinstance(record, dict):
                return record
            problem = record
        self.detail.update(state="broken", problem=problem)
        raise LeaseRefused(f"~/{self.shown_top}/{LEASE}: {problem}; clear it with deploy-hosts lease --release "
                           "--force")  # fmt: skip

    def problem(self, info: os.stat_result) -> "str | None":
        if stat.S_ISLNK(info.st_mode):
            return "is a symlink (never followed)"
        if stat.S_ISDIR(info.st_mode):
            return "is a directory, not a lease record"
        if not stat.S_ISREG(info.st_mode):
            return "is not a regular file (a FIFO, socket or device)"
        if info.st_uid != os.geteuid():
            return f"belongs to uid {info.st_uid}, not to this account"
        if info.st_size > RECORD_LIMIT:
            return f"is {info.st_size} bytes, more than a lease record ({RECORD_LIMIT})"
        return None

    def parse(self) -> "dict[str, Any] | str":
        """The record, or what is wrong with it."""
        try:
            fd = os.open(self.where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        try:
            data = os.read(fd, RECORD_LIMIT + 1)
        finally:
            os.close(fd)
        try:
            record = json.loads(data.decode("ascii"))
        except ValueError:
            return "is not a lease record (not ASCII JSON: half-written or edited by hand)"
        if not isinstance(record, dict) or record.get("schema") != LEASE_SCHEMA:
            return "is not a lease record (no narwhal.host-lease schema)"
        if not isinstance(record.get("token_sha256"), str) or not _number(record.get("expires")):
            return "is not a lease record (its token digest or expiry is missing or malformed)"
        holder = record.get("holder")
        if not isinstance(holder, dict) or not all(_field_ok(k, holder.get(k)) for k in HOLDER_FIELDS):
            return "is not a lease record (its holder is missing or malformed)"
        return record

    def leftovers(self) -> "list[str]":
        with contextlib.suppress(OSError), os.scandir(self.top) as entries:
            return sorted(e.name for e in entries if e.name.startswith(PART))[:LEFTOVER_LIMIT]
        return []

    def ours(self, record: "dict[str, Any] | None") -> bool:
        return record is not None and bool(self.token) and record["token_sha256"] == token_digest(self.token)

    def expired(self, record: "dict[str, Any]") -> bool:
        return time.time() > float(record["expires"])

    def dead(self, record: "dict[str, Any]") -> bool:
        """The workstation proved this holder gone: its process (same workstation, boot and pid) no longer runs,
        or no longer runs that operation."""
        gone = self.gone
        return isinstance(gone, dict) and all(record["holder"].get(k) == gone.get(k) for k in PROCESS_FIELDS)

    def describe(self, record: "dict[str, Any] | None") -> None:
        if record is not None:
            self.detail.update(holder=_public(record), expires_in=round(float(record["expires"]) - time.time(), 1))

    # ----------------------------------------------------------------- changes (each under the guard)

    def acquire(self) -> str:
        with self.guard():
            record = self.read()
            self.remove_leftovers()
            if record is not None and not self.ours(record):
                if not (self.expired(record) or self.dead(record)):
                    self.describe(record)
                    self.detail["state"] = "held"
                    raise LeaseRefused("held by another operation", _public(record))
                self.detail["broken"] = _public(record)
            self.write()
            return "acquired"

    def renew(self) -> str:
        with self.fenced():
            return "renewed"

    @contextlib.contextmanager
    def fenced(self) -> "Iterator[None]":
        """Under the guard: the record must still be ours (else nothing more is changed here); renewed, then
        the caller's change runs while the guard is held."""
        with self.guard():
            record = self.read()
            if not self.ours(record):
                self.describe(record)
                self.detail["state"] = "lost"
                who = _describe(record["holder"]) if record is not None else "nobody (released or cleared)"
                raise LeaseRefused(f"this operation's lease here was taken over (it now names {who}): nothing "
                                   "more is changed on this host", _public(record) if record else None)  # fmt: skip
            self.write()
            yield

    def release(self) -> str:
        with self.guard():
            record = self.read()
            if self.ours(record):
                self.unlink(LEASE)
                self.detail.update(state="absent", released=True)
                return "released"
            self.describe(record)
            self.detail["state"] = "absent" if record is None else "held"
            return "not held"

    def release_dead(self) -> str:
        """Anyone's lease, only once it expired or its process was proven gone."""
        with self.guard():
            record = self.read()
            if record is None:
                return "released"
            self.describe(record)
            if not (self.ours(record) or self.expired(record) or self.dead(record)):
                self.detail["state"] = "held"
                raise LeaseRefused("held by a live operation", _public(record))
            self.unlink(LEASE)
            self.detail.update(state="absent", released=True)
            return "released"

    def clear(self) -> str:
        """Whatever is at the record's name, its leftovers and an earlier version's fleet lock: removed without
        following a link (a directory is removed as a tree of its own entries)."""
        with self.guard():
            with contextlib.suppress(LeaseRefused):  # what it was is in `detail`; it goes all the same
                self.describe(self.read())
            removed = [name for name in [LEASE, OLD_FLEET_LOCK, *self.leftovers()] if self.unlink(name)]
            self.detail.update(state="absent", released=bool(removed), cleared=removed)
            return "cleared"

    def show(self) -> str:
        try:
            with self.guard():
                record = self.read()
        except LeaseRefused:
            return "shown"  # `detail` says what is there
        if record is not None:
            self.describe(record)
            self.detail["state"] = "expired" if self.expired(record) else "held"
        if os.path.lexists(os.path.join(self.top, OLD_FLEET_LOCK)):
            self.detail["old_fleet_lock"] = True
        return "shown"

    def write(self) -> None:
        record = {"schema": LEASE_SCHEMA, "schema_version": 1, "token_sha256": token_digest(self.token),
                  "holder": {k: self.holder.get(k, 0 if k == "pid" else "") for k in HOLDER_FIELDS},
                  "renewed": time.time(),
                  "expires": time.time() + self.lease_s}  # fmt: skip
        temp = os.path.join(self.top, f"{PART}{os.getpid()}")
        data = json.dumps(record, ensure_ascii=True, sort_keys=True).encode("ascii")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(temp, self.where)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        self.detail.update(state="ours")
        self.describe(record)

    def remove_leftovers(self) -> None:
        """Under the guard no live writer exists: every `.lease.part-*` is a killed writer's."""
        for name in self.leftovers():
            self.unlink(name)

    def unlink(self, name: str) -> bool:
        """Remove `name` in `~/<base>` without following it; a real directory goes with its own entries."""
        path = os.path.join(self.top, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True


def flock_within(fd: int, seconds: float) -> bool:
    """Take an exclusive `flock` of `fd`, waiting at most `seconds` (every wait on a host has a deadline)."""
    waited = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > waited:
                return False
            time.sleep(0.01)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _field_ok(name: str, value: object) -> bool:
    if name == "pid":
        return isinstance(value, int) and not isinstance(value, bool)
    return value is None or (isinstance(value, str) and len(value) <= 1024)  # None: a field the writer lacked


def _public(record: "dict[str, Any] | None") -> "dict[str, Any] | None":
    """What a report may say of a record: its holder and expiry, never the token digest."""
    if record is None:
        return None
    return dict(record["holder"], expires=record["expires"], renewed=record.get("renewed", 0.0))


def _describe(holder: "dict[str, Any]") -> str:
    return f"{holder.get('user', '?')}@{holder.get('workstation', '?')} ({holder.get('command', '?')})"


def lease_report(
    lease: HostLease, outcome: str, message: "str | None" = None, holder: "dict[str, Any] | None" = None
) -> "dict[str, Any]":
    detail = dict(lease.detail)
    if holder is not None:
        detail["holder"] = holder
    return {"outcome": outcome, "message": message, **detail, "now": time.time()}


def run_lease_action(lease: HostLease, action: str) -> "dict[str, Any]":
    """One lease action as a report (`outcome` `failed` with the message when refused)."""
    try:
        if action not in LEASE_ACTIONS:
            raise LeaseRefused("unknown lease action")
        return lease_report(lease, getattr(lease, action)())
    except LeaseRefused as refused:
        return lease_report(lease, "failed", refused.message, refused.holder)
    except OSError as exc:
        shown = os.path.relpath(exc.filename, lease.home) if exc.filename else action
        return lease_report(lease, "failed", f"{shown}: {exc.strerror}")


def lease_main(params_json: str) -> None:
    params = json.loads(params_json)
    os.umask(0o077)
    lease = HostLease(os.path.expanduser("~"), params["remote_base"], params.get("lease") or {})
    report = {"schema": LEASE_REPORT_SCHEMA, "schema_version": 1, "action": params.get("action"),
              **run_lease_action(lease, str(params.get("action")))}  # fmt: skip
    sys.stdout.write(json.dumps(report, ensure_ascii=True) + "\n")
    sys.stdout.flush()

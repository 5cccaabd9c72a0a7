"""Fleet deploy lock: runs on the fleet's first inventory host, fed on stdin like the installer.

Standard library only, Python 3.8+, ASCII source. One deploy (install, rollback, prune) at a time for the
whole fleet, from any workstation: the lock is the directory `~/<base>/.fleet-lock/`, made by one `mkdir`
(atomic), holding `owner.json` (who, where, when, the command, revision, deployment id, message, a token only
the holder knows, and the host-clock time of the last refresh). Actions:
- `acquire`: `mkdir`; if it exists and its lease (`lease_s` since the last refresh, host clock) is still
  running, report the holder and fail; if the lease ran out, or the workstation says the holder's process
  is gone (`holder_gone`: a killed deploy on that same workstation), take it over: rename the stale lock
  away, `mkdir` a fresh one, and report whose lock was broken.
Every change (acquire, refresh, release) happens under an exclusive `flock` of `~/.narwhal-fleet-lock.guard`, so
judging a lock stale and replacing it is one step: two takers of one stale lock cannot both win (one
would otherwise remove the lock the other had just made). The kernel drops a `flock` when its process
dies, so the guard itself can never go stale.
- `refresh`: the holder (same token) rewrites its record with a new refresh time; anyone else fails.
- `release`: remove the lock if the token is the holder's (or `force`); renamed away first, so a reader never
  sees a half-removed lock.
- `show`: the holder, if any, and whether its lease ran out.

A symlink, FIFO or other non-regular file where the lock belongs is never followed or opened: it fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import sys
import time

REPORT_SCHEMA = "narwhal.fleet-lock-report"
LOCK = ".fleet-lock"
OWNER = "owner.json"
# In the home directory, so the deployment directory holds nothing but deployments, `current` and the lock.
GUARD = ".narwhal-fleet-lock.guard"
OWNER_LIMIT = 16 * 1024
ACTIONS = ("acquire", "refresh", "release", "show")


class LockFailure(Exception):
    """The action cannot be done; the message says why (the holder, for a held lock)."""


class FleetLock:
    def __init__(self, params: dict) -> None:
        self.params = params
        self.home = os.path.expanduser("~")
        self.top = os.path.join(self.home, params["remote_base"])
        self.where = os.path.join(self.top, LOCK)
        self.detail: dict = {"holder": None, "stale": False, "broken": None}

    @contextlib.contextmanager
    def guard(self):  # an Iterator; hosts run Python 3.8 without importing typing
        fd = os.open(os.path.join(self.home, GUARD), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LockFailure(f"{GUARD} is not a regular file (left as it is)")
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def acquire(self) -> str:
        self.base_dir()
        with self.guard():
            return self._acquire()

    def _acquire(self) -> str:
        for _ in range(3):
            try:
                os.mkdir(self.where, 0o700)
            except FileExistsError:
                try:
                    holder = self.holder()
                except FileNotFoundError:
                    continue  # released or taken over between the two calls
                if not self.stale(holder) and not self.dead(holder):
                    self.detail["holder"] = holder
                    raise LockFailure("held") from None
                if self.take_over():
                    self.detail["broken"] = holder
                continue
            self.write_owner(dict(self.params["owner"], token=self.params["token"]))
            self.detail["holder"] = self.holder()
            return "acquired"
        raise LockFailure("the lock changed hands while it was being taken; try again")

    def refresh(self) -> str:
        self.base_dir()
        with self.guard():
            holder = self.own()
            self.write_owner(dict(holder, refreshed=time.time()))
        return "refreshed"

    def release(self) -> str:
        self.base_dir()
        with self.guard():
            return self._release()

    def _release(self) -> str:
        if not self.params.get("force"):
            self.own()
        elif not os.path.lexists(self.where):
            return "released"
        gone = f"{self.where}.released-{os.getpid()}"
        os.rename(self.where, gone)
        shutil.rmtree(gone, ignore_errors=True)
        return "released"

    def show(self) -> str:
        if os.path.lexists(self.where):
            holder = self.holder()
            self.detail.update(holder=holder, stale=self.stale(holder))
        return "shown"

    # ----------------------------------------------------------------- helpers

    def base_dir(self) -> None:
        """`~/<base>` as a plain directory (made if missing), never through a symlink."""
        try:
            info = os.lstat(self.top)
        except FileNotFoundError:
            os.mkdir(self.top, 0o700)
            return
        if not stat.S_ISDIR(info.st_mode):
            raise LockFailure(f"~/{self.params['remote_base']} is not a directory (left as it is)")

    def holder(self) -> dict | None:
        """The owner record, or None while a taker is between `mkdir` and writing it."""
        info = os.lstat(self.where)
        if not stat.S_ISDIR(info.st_mode):
            raise LockFailure(f"{LOCK} is not a directory (left as it is)")
        path = os.path.join(self.where, OWNER)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LockFailure(f"{LOCK}/{OWNER}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LockFailure(f"{LOCK}/{OWNER} is not a regular file (left as it is)")
            data = os.read(fd, OWNER_LIMIT + 1)
        finally:
            os.close(fd)
        try:
            record = json.loads(data[:OWNER_LIMIT].decode("utf-8"))
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def stale(self, holder: dict | None) -> bool:
        """The lease ran out; a record being written (None) is as fresh as the directory itself."""
        refreshed = (holder or {}).get("refreshed")
        if not isinstance(refreshed, (int, float)) or isinstance(refreshed, bool):
            refreshed = os.lstat(self.where).st_mtime
        return time.time() - refreshed > float(self.params["lease_s"])

    def dead(self, holder: dict | None) -> bool:
        """The workstation said this holder's process is gone (same workstation, boot and pid, not running)."""
        gone = self.params.get("holder_gone")
        keys = ("workstation", "boot", "pid", "pid_start")
        return isinstance(gone, dict) and holder is not None and all(holder.get(k) == gone.get(k) for k in keys)

    def take_over(self) -> bool:
        """Rename the stale lock away (a reader never sees it half removed), then delete it."""
        broken = f"{self.where}.broken-{os.getpid()}-{self.params['token'][:16]}"
        try:
            os.rename(self.where, broken)
        except FileNotFoundError:
            return False  # someone else took it over (or released it) first
        shutil.rmtree(broken, ignore_errors=True)
        return True

    def own(self) -> dict:
        if not os.path.lexists(self.where):
            raise LockFailure("not held")
        holder = self.holder() or {}
        if holder.get("token") != self.params["token"]:
            self.detail["holder"] = holder
            raise LockFailure("held by another deploy")
        return holder

    def write_owner(self, record: dict) -> None:
        record.setdefault("refreshed", time.time())
        temp = os.path.join(self.where, f".{OWNER}.part-{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temp, os.path.join(self.where, OWNER))


def _public(holder: dict | None) -> dict | None:
    """The holder without its token: only the holder may refresh or release."""
    return None if holder is None else {k: v for k, v in holder.items() if k != "token"}


def main(params_json: str) -> None:
    params = json.loads(params_json)
    os.umask(0o077)
    report = {"schema": REPORT_SCHEMA, "schema_version": 1, "action": params.get("action")}
    lock = FleetLock(params)
    try:
        if params.get("action") not in ACTIONS:
            raise LockFailure("unknown action")
        report["outcome"] = getattr(lock, params["action"])()
    except LockFailure as failure:
        report.update(outcome="failed", message=str(failure))
    except OSError as exc:
        shown = os.path.relpath(exc.filename, lock.home) if exc.filename else params.get("action")
        report.update(outcome="failed", message=f"{shown}: {exc.strerror}")
    report.update(holder=_public(lock.detail["holder"]), stale=lock.detail["stale"],
                  broken=_public(lock.detail["broken"]), now=time.time())  # fmt: skip
    sys.stdout.write(json.dumps(report, ensure_ascii=True) + "\n")
    sys.stdout.flush()

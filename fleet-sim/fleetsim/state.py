"""The record of everything a fleet created, and the one teardown that removes it.

The record is written to `<workdir>/fleet.json` after every step that creates something, so a fleet
can be removed by the process that made it (close, atexit), by `python -m fleetsim stop`
after a detached demo, or by hand after a crash, always through the same code path.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetsim import network, system

STATE_FILE = "fleet.json"
USER_COMMENT = "narwhal fleetsim"
PREFIX_RE = re.compile(r"[a-z][a-z0-9]{1,7}")


@dataclass
class FleetState:
    """Names of created resources, in creation order; teardown undoes them in reverse."""

    prefix: str
    workdir: str
    created_workdir: bool = False
    links: list[str] = field(default_factory=list)  # root-namespace links (sink, bridge, veths)
    netns: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # files and directories inside workdir
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # summary for people and the demo

    @property
    def path(self) -> Path:
        return Path(self.workdir) / STATE_FILE

    def save(self) -> None:
        """Write atomically with mode 0600 (the summary can hold a demo password)."""
        tmp = self.path.with_name(f".{STATE_FILE}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(self), out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, workdir: Path) -> FleetState:
        path = Path(workdir) / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise system.FleetError(f"{path}: no fleet state here (was the fleet started in this directory?)") from None
        state = cls(**raw)
        state.validate(Path(workdir))
        return state

    def validate(self, workdir: Path) -> None:
        """Refuse a record that names anything a fleet with this prefix could not have created.

        `stop` runs as root on a file from disk: without this, an edited fleet.json could delete any
        user, link or path.
        """
        problems = [] if PREFIX_RE.fullmatch(self.prefix) else [f"prefix {self.prefix!r}"]
        if Path(self.workdir).resolve() != workdir.resolve():
            problems.append(f"workdir {self.workdir!r} is not {str(workdir)!r}")
        problems += [f"link {n!r}" for n in self.links if not (n.startswith(self.prefix) and len(n) <= 15)]
        problems += [f"netns {n!r}" for n in self.netns if not n.startswith(self.prefix + "-")]
        problems += [f"user {n!r}" for n in self.users if not _fleet_user(n, self.prefix)]
        problems += [f"path {p!r}" for p in self.paths if not _inside(workdir, p)]
        if problems:
            raise system.FleetError(f"{self.path}: not a fleet record of this directory: {', '.join(problems)}")


def _fleet_user(name: str, prefix: str) -> bool:
    """Only accounts this module creates: the fleet's prefix and its comment in the passwd entry."""
    if not name.startswith(prefix):
        return False
    try:
        return pwd.getpwnam(name).pw_gecos.startswith(USER_COMMENT)
    except KeyError:
        return True  # already gone: nothing to delete


def _inside(workdir: Path, rel: str) -> bool:
    path = Path(rel)
    return not path.is_absolute() and ".." not in path.parts and workdir.resolve() in (workdir / path).resolve().parents


def teardown(state: FleetState) -> list[str]:
    """Remove every resource in `state`: processes, links, namespaces, users, files. Idempotent.

    Returns problems that did not stop the rest of the teardown (empty on a clean run).
    """
    problems: list[str] = []
    uids = {pwd.getpwnam(u).pw_uid for u in state.users if system.user_exists(u)}
    inodes = {i for i in map(system.netns_inode, state.netns) if i is not None}
    try:
        system.kill_host_processes(inodes, uids)
    except system.FleetError as exc:
        problems.append(str(exc))
    network.delete_netns(state.netns[::-1])  # first: the kernel then removes their veths in one batch
    network.delete_links(state.links[::-1])  # the sink, the bridge, and any veth still there
    for user in reversed(state.users):
        try:
            system.delete_user(user)
        except system.FleetError as exc:
            problems.append(str(exc))
    _remove_paths(state)
    return problems


def _remove_paths(state: FleetState) -> None:
    workdir = Path(state.workdir)
    for rel in reversed(state.paths):
        path = workdir / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    state.path.unlink(missing_ok=True)
    if state.created_workdir:
        with contextlib.suppress(OSError):  # something not ours is in it: leave the directory
            workdir.rmdir()

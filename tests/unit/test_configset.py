"""The config set is replaced all-or-nothing: a failure or a SIGKILL at any step leaves the complete previous set
or (after recovery) the complete new set, never a mix."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal_assets.core.errors import PublishError
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.local import configset

NAMES = ("deployment.env", "engine-launch.local.json", "fleet.json", "ssh.known_hosts")


def setup(root: Path) -> tuple[Settings, dict[Path, bytes], dict[Path, bytes]]:
    """A checkout holding the 'old' set (one file missing, to be created) and the 'new' set to publish."""
    (root / "config").mkdir(parents=True, mode=0o700)
    run_dir = root / "runs" / "discovery" / "run-2"
    run_dir.mkdir(parents=True, mode=0o700)
    old = {root / "config" / name: f"# old {name}\n".encode() for name in NAMES[:-1]}
    for path, data in old.items():
        path.write_bytes(data)
    new = {root / "config" / name: f"# new {name}\n".encode() for name in NAMES}
    new[run_dir / "manifest.json"] = b"{}\n"
    return Settings.load(root, environ={}), old, new


def state(root: Path) -> dict[str, bytes]:
    """Every file below the checkout by relative path (temporary and journal files included)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def expected(root: Path, files: dict[Path, bytes]) -> dict[str, bytes]:
    return {str(p.relative_to(root)): data for p, data in files.items()}


def without_locks(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if not name.endswith(".lock")}


def test_publish_replaces_every_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    settings, _, new = setup(tmp_path)
    with configset.publish_lock(settings):
        configset.publish_files(settings, tmp_path / "runs/discovery/run-2", new)
    assert without_locks(state(tmp_path)) == expected(tmp_path, new)


@pytest.mark.parametrize("failing_call", range(1, len(NAMES) + 3))
def test_a_failure_at_any_replace_keeps_the_previous_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    """Call 1 writes the journal; calls 2.. replace the targets in order. EPERM at any of them rolls back."""
    settings, old, new = setup(tmp_path)
    real_replace = os.replace
    calls = 0

    def replace(src: str | Path, dst: str | Path) -> None:
        nonlocal calls
        calls += 1
        if calls == failing_call:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises((PublishError, PermissionError)) as info, configset.publish_lock(settings):
        configset.publish_files(settings, tmp_path / "runs/discovery/run-2", new)
    assert without_locks(state(tmp_path)) == expected(tmp_path, old)
    if failing_call > 1:
        assert "the previous config set is unchanged" in str(info.value)
        assert "config/" in str(info.value) or "manifest.json" in str(info.value)


KILLER = """
import os, signal, sys
from pathlib import Path
from narwhal_assets.local import configset
from narwhal_assets.core.inputs.settings import Settings
root, kill_at = Path(sys.argv[1]), int(sys.argv[2])
real_replace, calls = os.replace, [0]
def replace(src, dst):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = replace
names = {names!r}
new = {{root / "config" / n: ("# new " + n + "\\n").encode() for n in names}}
new[root / "runs/discovery/run-2/manifest.json"] = b"{{}}\\n"
settings = Settings.load(root, environ={{}})
with configset.publish_lock(settings):
    configset.publish_files(settings, root / "runs/discovery/run-2", new)
"""


@pytest.mark.parametrize("kill_at", range(1, len(NAMES) + 3))
def test_sigkill_between_any_two_renames_recovers_to_one_complete_set(tmp_path: Path, kill_at: int) -> None:
    settings, old, new = setup(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", KILLER.format(names=NAMES), str(tmp_path), str(kill_at)], capture_output=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    committed = kill_at > 1  # the journal (call 1) commits the set
    assert configset.recover_publish(settings) is committed
    files = without_locks(state(tmp_path))
    # A publish killed before its journal existed leaves only hidden staging files, which nothing reads.
    stray = [name for name in files if Path(name).name.startswith(".") and name.endswith((".new", ".old", ".tmp"))]
    assert not (committed and stray), stray
    complete = {name: data for name, data in files.items() if name not in stray}
    assert complete == expected(tmp_path, new if committed else old)
    assert not configset.recover_publish(settings)


def test_a_recovery_that_cannot_complete_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, old, _ = setup(tmp_path)
    done = subprocess.run([sys.executable, "-c", KILLER.format(names=NAMES), str(tmp_path), "3"], capture_output=True)
    assert done.returncode == -signal.SIGKILL
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        if str(src).endswith(".new") and Path(dst).name == "fleet.json":
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PublishError, match="could not be completed and was rolled back"):
        configset.recover_publish(settings)
    files = without_locks(state(tmp_path))
    assert {n: d for n, d in files.items() if not n.endswith(".new")} == expected(tmp_path, old)

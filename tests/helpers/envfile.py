"""Bash as the reference for `.env` files: what it sees after sourcing them, and the hypothesis settings and
value strategy the property tests against it use."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")

# Sources each file named in "$@" in a fresh subshell (`set -a`) and prints, per name, "<set?>\0<value>\0",
# then "END\0"; a file bash fails on prints "ERR\0END\0".
_BASH_SCRIPT = r"""
names=$1; shift
for f in "$@"; do
  ( set -a; . "$f" || exit 1
    for n in $names; do
      if [ "${!n+x}" = x ]; then printf '1\0%s\0' "${!n}"; else printf '0\0\0'; fi
    done ) || printf 'ERR\0'
  printf 'END\0'
done
"""


def bash_view(tmp_path: Path, texts: list[str], names: tuple[str, ...]) -> list[dict[str, str] | str]:
    """What `env -i bash` sees after sourcing each text: {name: value} for the names it set, or 'ERR'."""
    paths = []
    for index, text in enumerate(texts):
        path = tmp_path / f"case-{index}.env"
        path.write_bytes(text.encode("utf-8"))
        paths.append(str(path))
    proc = subprocess.run(
        ["env", "-i", BASH or "bash", "--noprofile", "--norc", "-c", _BASH_SCRIPT, "bash", " ".join(names), *paths],
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    fields = iter(proc.stdout.split(b"\0"))
    views: list[dict[str, str] | str] = []
    for _ in texts:
        first = next(fields)
        if first == b"ERR":
            views.append("ERR")
        else:
            rest = [next(fields) for _ in range(2 * len(names) - 1)]
            flat = [first, *rest]
            views.append({n: flat[2 * i + 1].decode("utf-8") for i, n in enumerate(names) if flat[2 * i] == b"1"})
        assert next(fields) == b"END", proc.stdout
    assert list(fields) == [b""], proc.stdout
    return views


HYPO = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any character bash can hold: everything but NUL and surrogates; CR is refused by the parser anyway.
ANY_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r")
VALUES = st.text(alphabet=st.one_of(ANY_CHAR, st.sampled_from("'\"\\$`\n !~{}*?#;&|()<>\t\x01\x7f")), max_size=40)

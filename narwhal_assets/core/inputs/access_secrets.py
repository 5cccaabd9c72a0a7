"""Management access values (destinations, passwords) and the scan that proves prepared files hold none.

Role files and every other prepared file leave the workstation; access stays in `.env`, the inventory and
the trust store. Findings name what leaked and where, never the value.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from narwhal_assets.core.inputs.inventory import Inventory, destination_variables
from narwhal_assets.core.inputs.settings import Settings

# A destination or password counts where it stands as a whole token, so a short alias such as `gpu-a`
# is not "found" inside an unrelated longer word.
_TOKEN_CHARS = r"A-Za-z0-9_.@-"
_RUN_RE = re.compile(f"[{_TOKEN_CHARS}]+")
PRIVATE_KEY_MARKER = "PRIVATE KEY-----"


@dataclass(frozen=True)
class Needle:
    """A value that must not appear in prepared files, and how to name it in a finding."""

    label: str
    value: str
    whole_token: bool = True

    def found_in(self, text: str) -> bool:
        """One needle alone (`Scanner` looks for many at once)."""
        return bool(self.value) and bool(Scanner([self]).findings(text))


@dataclass(frozen=True)
class _Anchored:
    """A needle found through one of its maximal runs of token characters: `offset` is where that run
    starts inside the value."""

    needle: Needle
    offset: int


@dataclass
class Scanner:
    """Every needle looked for in one pass over a text, whatever their number.

    The text is cut once into maximal runs of token characters. A whole-token value that is one such run is
    a dictionary lookup per run. Any other value is anchored on one of its own runs that must show up in
    the text as a maximal run wherever the value does (one that the value's own non-token characters bound
    on both sides, or, for a whole-token value, its first run), and is verified at the few places that run
    occurs; only a value without such a run (all punctuation, say) is searched for directly. So a scan
    costs the text's length plus the matches, not the text times the number of secrets.
    """

    needles: Iterable[Needle]
    _position: dict[Needle, int] = field(init=False, default_factory=dict)  # the order findings are named in
    _runs: dict[str, list[Needle]] = field(init=False, default_factory=lambda: defaultdict(list))
    _anchored: dict[str, list[_Anchored]] = field(init=False, default_factory=lambda: defaultdict(list))
    _searched: list[Needle] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self._position = {}
        for needle in self.needles:
            if needle.value:
                self._position.setdefault(needle, len(self._position))
        for needle in self._position:
            runs = list(_RUN_RE.finditer(needle.value))
            if needle.whole_token and len(runs) == 1 and runs[0].group() == needle.value:
                self._runs[needle.value].append(needle)
                continue
            # A run inside the value (not touching either end) is bounded by the value's own characters; a
            # whole-token value's first run is bounded by the token boundary before it, unless it is the last.
            inner = [r for r in runs if r.start() > 0 and r.end() < len(needle.value)]
            if needle.whole_token and runs and runs[0].start() == 0 and runs[0].end() < len(needle.value):
                inner.append(runs[0])
            if needle.whole_token and runs and runs[-1].end() == len(needle.value) and runs[-1].start() > 0:
                inner.append(runs[-1])
            if inner:
                anchor = max(inner, key=lambda r: len(r.group()))
                self._anchored[anchor.group()].append(_Anchored(needle, anchor.start()))
            else:
                self._searched.append(needle)

    def findings(self, text: str) -> list[str]:
        """Labels of the needles present in `text`, each once, in the order they were given."""
        found: set[Needle] = set()
        runs, anchored = self._runs, self._anchored
        for match in _RUN_RE.finditer(text):
            run = match.group()
            if run in runs:
                found.update(runs[run])
            for candidate in anchored.get(run, ()):
                if _occurs_at(text, candidate.needle, match.start() - candidate.offset):
                    found.add(candidate.needle)
        found.update(needle for needle in self._searched if _occurs(text, needle))
        return list(dict.fromkeys(needle.label for needle in sorted(found, key=self._position.__getitem__)))


def _occurs_at(text: str, needle: Needle, start: int) -> bool:
    if start < 0 or not text.startswith(needle.value, start):
        return False
    return not needle.whole_token or _bounded(text, start, start + len(needle.value))


def _occurs(text: str, needle: Needle) -> bool:
    start = text.find(needle.value)
    while start >= 0:
        if not needle.whole_token or _bounded(text, start, start + len(needle.value)):
            return True
        start = text.find(needle.value, start + 1)
    return False


def _bounded(text: str, start: int, end: int) -> bool:
    """No token character just before `start` or at `end`."""
    return (start == 0 or not _RUN_RE.match(text, start - 1)) and (end >= len(text) or not _RUN_RE.match(text, end))


def access_variables(settings: Settings, inventory: Inventory) -> dict[str, str]:
    """Variable name -> what it is, for every access variable of the inventory and every role destination."""
    found: dict[str, str] = {}
    for entry in inventory.hosts:
        found[entry.ssh_env] = f"the inventory ssh_env of host {entry.id}"
        if entry.password_env:
            found[entry.password_env] = f"the inventory password_env of host {entry.id}"
    for role, variable in destination_variables(settings).items():
        found.setdefault(variable, f"the management destination variable of {role}")
    return found


def access_needles(settings: Settings, inventory: Inventory) -> list[Needle]:
    """The current values of every access variable (never an empty one)."""
    needles = []
    for variable, what in sorted(access_variables(settings, inventory).items()):
        value = settings.get(variable)
        if value:
            kind = "password" if "password_env" in what else "management destination"
            needles.append(Needle(f"the {kind} in {variable}", value))
    return needles


def host_key_needles(key_blobs: Iterable[str]) -> list[Needle]:
    """Host keys pinned in the trust store (their base64 blobs) and any private key."""
    needles = [Needle("a host key from the trust store", blob, whole_token=False) for blob in sorted(set(key_blobs))]
    return [*needles, Needle("a private key (SSH identity)", PRIVATE_KEY_MARKER, whole_token=False)]

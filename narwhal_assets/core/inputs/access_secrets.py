"""Management access values (destinations, passwords) and the scan that proves prepared files hold none.

Role files and every other prepared file leave the workstation; access stays in `.env`, the inventory and
the trust store. Findings name what leaked and where, never the value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from narwhal_assets.core.inputs.inventory import Inventory, destination_variables
from narwhal_assets.core.inputs.settings import Settings

# A destination or password counts where it stands as a whole token, so a short alias such as `gpu-a`
# is not "found" inside an unrelated longer word.
_TOKEN_CHARS = r"A-Za-z0-9_.@-"
PRIVATE_KEY_MARKER = "PRIVATE KEY-----"


@dataclass(frozen=True)
class Needle:
    """A value that must not appear in prepared files, and how to name it in a finding."""

    label: str
    value: str
    whole_token: bool = True

    def found_in(self, text: str) -> bool:
        if not self.value:
            return False
        if not self.whole_token:
            return self.value in text
        pattern = rf"(?<![{_TOKEN_CHARS}]){re.escape(self.value)}(?![{_TOKEN_CHARS}])"
        return re.search(pattern, text) is not None


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


def findings(text: str, needles: Iterable[Needle]) -> list[str]:
    """Labels of the needles present in `text` (linear scans, one per needle)."""
    return [needle.label for needle in needles if needle.found_in(text)]

"""Terminal-safe rendering of strings that came from a host (hostnames, GPU names, tool messages).

A host controls these bytes: ESC/CSI sequences would drive the operator's terminal, a newline or a Unicode
line separator would forge an extra output line, a bidi control would reorder what is shown, and a lone
surrogate (valid in JSON) would crash the print. `printable` escapes all of them in one linear pass and
bounds the length; files keep the exact value (JSON escapes it there).
"""

from __future__ import annotations

import re
import unicodedata

DEFAULT_LIMIT = 256
# Control, format (bidi, zero-width), surrogate, line/paragraph separator and unassigned code points.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})
_SUSPECT = re.compile(r"[^\x20-\x7e]")  # printable ASCII is never looked at twice
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    if unicodedata.category(char) not in UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF
                                else f"\\U{code:08x}")  # fmt: skip


def _in_line(match: re.Match[str]) -> str:
    return _escaped(match.group())


def _in_block(match: re.Match[str]) -> str:
    char = match.group()
    return char if char in "\n\t" else _escaped(char)


def printable(text: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """`str(text)` on one line with every unsafe character escaped (`\\x1b`, `\\n`, `\\u202e`).

    At most `limit` characters of the input are shown (None: all), then `...(+N characters)`.
    """
    value = str(text)
    shown = value if limit is None else value[:limit]
    escaped = _SUSPECT.sub(_in_line, shown)
    return escaped if len(shown) == len(value) else f"{escaped}...(+{len(value) - len(shown)} characters)"


def printable_block(text: str) -> str:
    """Multi-line text (a tool's output in a log file): newlines and tabs kept, everything else as above."""
    return _SUSPECT.sub(_in_block, text)

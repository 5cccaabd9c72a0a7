"""Terminal-safe rendering of strings that came from a host (hostnames, GPU names, tool messages).

A host controls these bytes: ESC/CSI sequences would drive the operator's terminal, a newline or a Unicode
line separator would forge an extra output line, a bidi override would reorder what is shown, and a lone
surrogate (valid in JSON) would crash the print. `printable` escapes all of them in one linear pass and
bounds the length; files keep the exact value (JSON escapes it there).
"""

from __future__ import annotations

import re

DEFAULT_LIMIT = 256
# C0 and C1 controls, DEL, surrogates, and the Unicode format/separator characters that move or hide text:
# zero-width and directional marks, line/paragraph separators, bidi embeddings/overrides/isolates, BOM.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_KEPT_IN_BLOCKS = "\n\t"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def _escape_in_block(match: re.Match[str]) -> str:
    char = match.group()
    return char if char in _KEPT_IN_BLOCKS else _escape(match)


def printable(text: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """`text` on one line with every control/format character escaped (`\\x1b`, `\\n`, `\\u202e`).

    At most `limit` characters of the input are shown (None: all), then `...(+N characters)`.
    """
    value = str(text)
    shown = value if limit is None else value[:limit]
    escaped = _UNSAFE.sub(_escape, shown)
    return escaped if len(shown) == len(value) else f"{escaped}...(+{len(value) - len(shown)} characters)"


def printable_block(text: str) -> str:
    """Multi-line text (a tool's output in a log file) with newlines and tabs kept, everything else escaped."""
    return _UNSAFE.sub(_escape_in_block, text)

"""`printable`: host-derived text on one terminal line, every control or reordering character escaped."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from narwhal_assets.core.display import DEFAULT_LIMIT, printable, printable_block

UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"}


def unsafe(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNSAFE_CATEGORIES]


def test_escape_sequences_newlines_and_bidi_overrides_are_shown_escaped() -> None:
    hostile = "gpu\x1b]0;pwned\x07\x1b[2J\r\nok   forged\x9b31m\u202edelr\u2028x\x00\ud800\u061c\U000e0041"
    shown = printable(hostile)
    assert shown == (
        "gpu\\x1b]0;pwned\\x07\\x1b[2J\\r\\nok   forged\\x9b31m\\u202edelr\\u2028x\\x00\\ud800\\u061c\\U000e0041"
    )
    shown.encode("utf-8")  # a lone surrogate (valid in JSON) no longer breaks printing
    assert printable("NVIDIA H200 (Ü, 日本)") == "NVIDIA H200 (Ü, 日本)"


def test_length_is_bounded_and_says_how_much_was_cut() -> None:
    assert printable("x" * 1000) == "x" * DEFAULT_LIMIT + f"...(+{1000 - DEFAULT_LIMIT} characters)"
    assert printable("x" * 1000, None) == "x" * 1000
    assert printable(12) == "12"


def test_blocks_keep_newlines_and_tabs_only() -> None:
    assert printable_block("a\tb\nc\x1b[0m\r\n") == "a\tb\nc\\x1b[0m\\r\n"


HOSTILE_CHARS = st.one_of(st.characters(), st.sampled_from("\x1b\x07\x9b\u061c\u202e\u2028\ufeff\ud800"))


@given(st.text(alphabet=HOSTILE_CHARS, max_size=300))
def test_no_unsafe_character_survives(text: str) -> None:
    shown = printable(text)
    assert not unsafe(shown) and "\n" not in shown
    assert not unsafe(printable_block(text).replace("\n", "").replace("\t", ""))

"""The credential scanner finds exactly what a per-needle regex scan finds, in one pass for any number of secrets."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal_assets.core.inputs.access_secrets import Needle, Scanner, host_key_needles

TOKEN = "A-Za-z0-9_.@-"


def one_by_one(text: str, needles: list[Needle]) -> list[str]:
    """The definition: each needle on its own, a whole token unless it says otherwise."""
    found = []
    for needle in needles:
        if not needle.value:
            continue
        pattern = re.escape(needle.value)
        if needle.whole_token:
            pattern = rf"(?<![{TOKEN}]){pattern}(?![{TOKEN}])"
        if re.search(pattern, text) and needle.label not in found:
            found.append(needle.label)
    return found


ALPHABET = "ab.@-_ !'\n+/="
values = st.text(alphabet=ALPHABET, min_size=1, max_size=6)
needle_lists = st.lists(st.tuples(values, st.booleans()), min_size=1, max_size=8).map(
    lambda pairs: [Needle(f"n{i}", value, whole) for i, (value, whole) in enumerate(pairs)])


@settings(max_examples=400, deadline=None)
@given(needle_lists, st.text(alphabet=ALPHABET, max_size=40))
def test_one_pass_finds_what_each_needle_finds_alone(needles: list[Needle], text: str) -> None:
    assert Scanner(needles).findings(text) == one_by_one(text, needles)


def test_destinations_passwords_and_host_keys_in_role_file_text() -> None:
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIK3h+vYbX/9QwertyUIOPasdfghjkl0123456789zxcvbnmQWER"
    needles = [Needle("dest", "ops@gpu-b.example"), Needle("alias", "gpu-a"), Needle("pw", "p@ss word!"),
               *host_key_needles([blob])]
    text = "export A='gpu-a'\nexport B='ops@gpu-b.example:22'\nexport C='x p@ss word! y'\nkey " + blob[5:40] + "\n"
    assert Scanner(needles).findings(text) == ["dest", "alias", "pw"]  # `:` ends a token; the key is only partly there
    assert Scanner(needles).findings(f"k {blob}\n-----BEGIN OPENSSH PRIVATE KEY-----\nops@gpu-b.example") == [
        "dest", "a host key from the trust store", "a private key (SSH identity)"]
    assert Scanner(needles).findings("gpu-ab my-gpu-a ops@gpu-a") == []


def test_many_secrets_cost_one_pass() -> None:
    """A thousand destinations against a large role file: each run of token characters is looked up once."""
    needles = [Needle(f"host {n}", f"mgmt-sentinel-{n:04d}") for n in range(1000)]
    text = "".join(f"export NARWHAL_NODE_{n}_IP='198.18.{n // 250}.{n % 250 + 1}'\n" for n in range(1000))
    scanner = Scanner(needles)
    assert scanner.findings(text) == []
    assert scanner.findings(text + "mgmt-sentinel-0999\n") == ["host 999"]

"""Commands the README prints, read from the README itself, so a test runs exactly what an operator copies."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK_RE = re.compile(r"```sh\n(.*?)```", re.DOTALL)


def sh_block(starts_with: str) -> str:
    """The one ```sh block of the README whose text starts with `starts_with`."""
    found = [block for block in _BLOCK_RE.findall(README.read_text(encoding="utf-8")) if block.startswith(starts_with)]
    assert len(found) == 1, f"README: expected one sh block starting {starts_with!r}, found {len(found)}"
    return found[0]


def tree_digest_command() -> str:
    """The README's `tree_sha256` pipeline, to run in the model directory."""
    return sh_block("cd MODEL_DIR && find ").removeprefix("cd MODEL_DIR && ").strip()


def model_tree_digest_command() -> str:
    """The README's `model_tree_sha256` program, to run in the model directory."""
    return sh_block("cd MODEL_DIR && python3 ").removeprefix("cd MODEL_DIR && ").strip()

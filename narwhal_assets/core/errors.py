"""Errors whose messages are safe to show: they name files, fields, variables and hosts, never values."""

from __future__ import annotations

from collections.abc import Iterable


class NarwhalError(Exception):
    """A failure an operator can act on; `str()` is one or more complete, secret-free lines."""


class InputError(NarwhalError):
    """Bad input: every problem found, one line each, so the operator fixes them in one pass."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        if not self.problems:
            raise ValueError("InputError needs at least one problem")
        super().__init__("\n".join(self.problems))


def raise_if(problems: list[str]) -> None:
    """Raise `InputError` when any problem was collected."""
    if problems:
        raise InputError(problems)

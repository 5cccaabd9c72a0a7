"""Errors whose messages are safe to show: they name files, fields, variables and hosts, never values.

Two categories, matching the exit rule: `InputError` is the operator's own files and arguments (exit 2,
nothing written); any other `NarwhalError`, `HostFailure` in particular, is a host or run failure (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


class NarwhalError(Exception):
    """A failure an operator can act on; `str()` is one or more complete, secret-free lines."""


class InputError(NarwhalError):
    """Bad input: every problem found, one line each, so the operator fixes them in one pass."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        if not self.problems:
            raise ValueError("InputError needs at least one problem")
        super().__init__("\n".join(self.problems))


class HostFailure(NarwhalError):
    """A host could not be used or returned output that fails validation: that host failed, not the input."""


class Problems(list[str]):
    """Problems collected across independent checks, raised together as one `InputError`."""

    def attempt(self, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)`, or None after recording its input problems."""
        try:
            return fn(*args)
        except InputError as exc:
            self.extend(exc.problems)
            return None

    def raise_if_any(self) -> None:
        raise_if(self)


def raise_if(problems: list[str]) -> None:
    """Raise `InputError` when any problem was collected."""
    if problems:
        raise InputError(problems)


def raise_together(failures: Iterable[NarwhalError]) -> None:
    """Every failure in one error: bad input (exit 2) only if all of them are input problems."""
    failures = list(failures)
    if not failures:
        return
    lines = [line for failure in failures for line in str(failure).splitlines()]
    if all(isinstance(f, InputError) for f in failures):
        raise InputError(lines)
    raise HostFailure("\n".join(lines))

"""Every error the product raises, in one hierarchy; their messages are safe to show: they name files,
fields, variables and hosts, never values.

Two categories, matching the exit rule: `InputError` (and its subclasses) is the operator's own files and
arguments (exit 2, nothing written); any other `NarwhalError` is a host or run failure (exit 1). The host
programs under `host/` raise their own few errors: they run alone on hosts, with the standard library only.
Errors that never leave the module that raises them (a parse step's `ValueError`) stay there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

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


class OpenSshRefused(InputError):
    """OpenSSH refused the config (or did not answer in time); the message names the config file."""


class HostFailure(NarwhalError):
    """A host could not be used or returned output that fails validation: that host failed, not the input."""


class SshFailure(NarwhalError):
    """A host could not be reached or used; the message names host id, address and cause."""


class HostKeyError(NarwhalError):
    """The host could not be authenticated; never retried with weaker checking."""


class HostKeyUnknown(HostKeyError):
    """No key is known for the host (strict mode refuses it; enrolment stages it)."""


class HostKeyChanged(HostKeyError):
    """The host presented another key than the one known for it."""


class HostKeyRevoked(HostKeyError):
    """The host presented a key marked `@revoked`."""


class ReportError(NarwhalError):
    """The host's answer was not an installer report (the installer did not run or was cut off)."""


class LeaseReportError(NarwhalError):
    """The host's answer was not a lease report."""


class DriftProbeError(NarwhalError):
    """The drift probe's output is unusable; the message names the host."""


class ProbeOutputError(NarwhalError):
    """Every problem in one host's probe output, plus its command log so the caller can still save it.

    What a host printed is a host failure, never bad input from the operator: it is not an InputError.
    """

    def __init__(self, problems: Iterable[str], log: list[dict[str, Any]]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
        self.command_log = log


class HostInstallFailure(NarwhalError):
    """A host stopped at a gate; its content on the host was left as it was."""

    def __init__(self, host_id: str, gate: str, message: str) -> None:
        super().__init__(f"host {host_id}: failed at gate {gate!r}: {message}")
        self.gate = gate
        self.message = message


class LeaseError(NarwhalError):
    """A host's lease belongs to another operation, is stuck, or could not be read or changed."""


class LeaseConflict(LeaseError):
    """Another operation holds (or a stuck record blocks) the lease on a selected host: nothing was changed."""


class RolloutFailed(NarwhalError):
    """At least one host failed or was not staged; every host's outcome is in the run's events."""


class PublishError(NarwhalError):
    """The new set could not be published; the previous set is in place."""


class StorageError(NarwhalError):
    """Dagster's own storage failed (disk full, database down); says whether the config set was published."""


class UiStopped(NarwhalError):
    """Dagster stopped by itself (a port taken meanwhile, a broken instance); the log's end says why."""


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

"""The installer's `status` and `prune` replies as the workstation parses them: bounded, escaped, strict."""

from __future__ import annotations

import json

import pytest

from narwhal_assets.core.errors import ReportError
from narwhal_assets.host import program_source
from narwhal_assets.protocols.install import ENTRY_LIMIT, INSTALLER, installer_script, parse_install_report
from narwhal_assets.protocols.lease import lease_source
from narwhal_assets.workflows.install import HostOutcome

ID = "0123456789abcdef0123456789abcdef"


def reply(**fields: object) -> bytes:
    base = {"schema": "narwhal.install-report", "schema_version": 1, "action": "status", "outcome": "listed"}
    return json.dumps({**base, **fields}).encode() + b"\n"


def entry(**fields: object) -> dict[str, object]:
    return {"name": ID, "state": "installed", "revision": "a" * 40, "check": "intact", **fields}


def test_a_status_reply_parses_with_every_host_string_escaped() -> None:
    report = parse_install_report(reply(current=ID, deployments=[
        entry(), entry(name="evil\x1b[2J", state="foreign", check="unknown", revision=None),
        entry(check="tampered", problem="checkout/x\x07: content differs")]))  # fmt: skip
    assert report.current == ID
    assert [d.name for d in report.deployments] == [ID, "evil\\x1b[2J", ID]
    assert report.deployments[2].problem == "checkout/x\\x07: content differs"


@pytest.mark.parametrize(
    "fields",
    [
        {"deployments": [entry()] * (ENTRY_LIMIT + 1)},
        {"deployments": [entry(name="x" * 65)]},
        {"deployments": [entry(state="running")]},
        {"deployments": [entry(problem="p" * 5000)]},
        {"current": "c" * 65},
        {"outcome": "pruned", "removed": ["../../etc"]},
        {"outcome": "pruned", "kept": {"not-an-id": "locked"}},
        {"notes": ["n" * 601]},
        {"notes": ["note"] * (ENTRY_LIMIT + 1)},
    ],
)
def test_oversize_or_malformed_replies_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ReportError, match="not an install report"):
        parse_install_report(reply(**fields))


def test_a_prune_reply_names_only_deployment_ids() -> None:
    report = parse_install_report(reply(action="prune", outcome="pruned", removed=[ID],
                                        kept={"f" * 32: "current points at it\x1b]"}))  # fmt: skip
    assert report.removed == [ID] and report.kept == {"f" * 32: "current points at it\\x1b]"}


def test_the_installers_notes_reach_the_host_line_escaped() -> None:
    report = parse_install_report(reply(action="install", outcome="staged",
                                        notes=[".install-lock of pid 7 (gone) \x1b[31m: taken over"]))  # fmt: skip
    assert report.notes == [".install-lock of pid 7 (gone) \\x1b[31m: taken over"]
    outcome = HostOutcome("node-1", outcome="installed", activation="activated", current_before=None,
                          notes=report.notes)  # fmt: skip
    assert outcome.describe().startswith("installed, activated (was none) (0 files, 0 bytes sent")
    assert outcome.describe().endswith("; .install-lock of pid 7 (gone) \\x1b[31m: taken over")


def test_the_lease_source_travels_only_with_a_lease() -> None:
    """A `status` (no lease) ships the installer alone; an action given a lease ships the lease's classes after it."""
    leased = installer_script({"action": "inspect", "lease": {"mode": "acquire"}})
    unleased = installer_script({"action": "status", "remote_base": "Narwhal-deploy", "known": {}})
    assert lease_source().strip() in leased
    assert "class HostLease" not in unleased
    assert unleased.startswith(program_source(INSTALLER).rstrip())
    assert len(leased) - len(unleased) >= len(lease_source()) - 100

"""Faults and hostile hosts against real sshd hosts: every SSH step is bounded,
the failure says which bound was hit, nothing we stopped keeps running on the host, and host output is
capped, parsed linearly and escaped before it reaches a terminal.

Bounded time is shown by *which* mechanism ended a step (the message names it), never by a stopwatch:
keep-alives of 1 s x 3 against command timeouts of minutes. Processes are looked up on the simulated
host through /proc (the hosts share this machine's PID namespace), by the host user's uid (helpers.faults).

The fleet is the model fleet (the `fleet` fixture, its own instance here): h1 router + engine-1, h2 engine-2
(password), h3 engine-3. Every test restores what it breaks.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli, discover, failing_discover, run_dirs
from helpers.faults import GUARD, KEEPALIVE_LOST, STALL, gone, host_tool, started_marker, when_started
from helpers.files import read_json, snapshot
from helpers.fleet_checkout import make_checkout

from narwhal_assets.core.errors import SshFailure
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.host import program_stream
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.transport import DEFAULT_OUTPUT_LIMIT, HostConnection
from narwhal_assets.ssh.trust import TrustMode

FAST_ALIVE = {"NARWHAL_SSH_ALIVE_INTERVAL": "1", "NARWHAL_SSH_ALIVE_COUNT": "3"}


# --------------------------------------------------------------------------------------------- helpers


@pytest.fixture
def checkout(tmp_path: Path, fleet: SimFleet, ssh_config: Path) -> Path:
    return make_checkout(tmp_path / "checkout", fleet, ssh_config, **FAST_ALIVE)


@contextmanager
def connected(root: Path, host_id: str, **bounds: float) -> Iterator[HostConnection]:
    """A strict connection to one host of the checkout (enrolled first), with the checkout's bounds."""
    settings = Settings.load(root)
    entry = Checkout.from_settings(settings).inventory.host(host_id)
    connector = make_connector(settings, TrustMode.STRICT, **bounds)
    with connector.connect(host_accesses(settings, [entry])[0]) as connection:
        yield connection


# --------------------------------------------------------------------------------------------- transport


def test_a_timed_out_command_leaves_no_process_on_the_host(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    with connected(checkout, "node-1") as connection, pytest.raises(SshFailure) as failure:
        connection.run("sleep 3101 & sleep 3102; echo never", timeout=2)
    assert "command `sleep 3101 & sleep 3102; echo never` did not finish within 2 s (command timeout)" in str(
        failure.value
    )
    assert not gone(fleet, "h1", "sleep 310", GUARD), "the timed-out command is still running on the host"


def test_connections_send_each_message_at_once(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TCP_NODELAY: without it the kernel holds a small SSH message back until the host acknowledges the one
    before, which a delayed ACK makes 40 ms, several times per connection and per command."""
    discover(checkout, capsys)
    with connected(checkout, "node-1") as connection:
        assert connection.run("true").rc == 0
        sock = connection.transport.sock
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_modules_in_the_host_account_home_cannot_shadow_what_our_programs_import(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Commands start in the account's home; a `json.py` there (a common file name) must not run in place of
    the standard library module in the probe, the drift probe or the installer."""
    discover(checkout, capsys)
    home = fleet.host("h1").home
    shadows = [home / f"{name}.py" for name in ("json", "hashlib", "subprocess", "threading")]
    stdlib_json = "import json, sys; sys.stdout.write(json.__file__)\n"
    try:
        for shadow in shadows:
            shadow.write_text("raise SystemExit('a module of the home directory ran')\n")
        discover(checkout, capsys)
        with connected(checkout, "node-1") as connection:
            result = connection.run_program("json-check", program_stream(stdlib_json))
            assert result.rc == 0, result.stderr
            assert result.text().endswith("/json/__init__.py"), result.text()
            assert not result.text().startswith(fleet.host("h1").remote_home), result.text()
    finally:
        for shadow in shadows:
            shadow.unlink(missing_ok=True)


def test_a_finished_command_leaves_nothing_it_started_in_the_background(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    with connected(checkout, "node-2") as connection:  # the password host
        result = connection.run("sleep 3201 & echo started; exit 7")
    assert (result.rc, result.text()) == (7, "started\n")
    assert not gone(fleet, "h2", "sleep 3201", GUARD)


def test_output_beyond_the_limit_stops_reading_and_stops_the_command(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    with connected(checkout, "node-3", command_timeout=600) as connection, pytest.raises(SshFailure) as failure:
        connection.run("cat /dev/zero")
    assert f"printed more than {DEFAULT_OUTPUT_LIMIT} bytes (output limit)" in str(failure.value)
    assert not gone(fleet, "h3", "cat /dev/zero", GUARD)


def test_a_link_cut_mid_command_is_detected_by_keepalive_not_the_command_timeout(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    try:
        with connected(checkout, "node-3", command_timeout=600) as connection:
            threading.Timer(1.0, fleet.cut_link, args=("h3",)).start()
            with pytest.raises(SshFailure) as failure:
                connection.run("sleep 3301")
    finally:
        fleet.restore_link("h3")
    assert f"host node-3 ({fleet.host('h3').address}:22): {KEEPALIVE_LOST}" == str(failure.value)


def test_an_idle_connection_sends_no_keepalive_and_the_next_command_finds_a_link_cut_meanwhile(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """A staged host's connection waits idle for the rest of the fleet: it must cost nothing while it waits
    (a keep-alive would have closed it here, 3 s into the silence), and still be bounded once used again."""
    discover(checkout, capsys)
    try:
        with connected(checkout, "node-3", command_timeout=600) as connection:
            assert connection.run("true").rc == 0
            fleet.cut_link("h3")
            threading.Event().wait(4.5)  # longer than the keep-alive window, with nothing under way
            assert connection.transport.is_active() and connection.watchdog and connection.watchdog.reason is None
            with pytest.raises(SshFailure) as failure:
                connection.run("true")
    finally:
        fleet.restore_link("h3")
    assert f"host node-3 ({fleet.host('h3').address}:22): {KEEPALIVE_LOST}" == str(failure.value)


def test_a_killed_sshd_mid_command_says_the_host_closed_the_connection(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    try:
        with connected(checkout, "node-3", command_timeout=600) as connection:
            threading.Timer(1.0, fleet.kill_sshd, args=("h3",)).start()
            with pytest.raises(SshFailure) as failure:
                connection.run("sleep 3401")
    finally:
        fleet.start_host("h3")
    assert "connection closed by the host before command `sleep 3401` finished" in str(failure.value)


# --------------------------------------------------------------------------------------------- discovery


def test_discovery_with_a_cut_link_and_a_killed_sshd_fails_only_those_hosts(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    Checkout.open(checkout).save_inventory()
    before = snapshot(checkout / "config")
    for name in ("h2", "h3"):
        started_marker(fleet, name).unlink(missing_ok=True)

    def break_hosts() -> None:
        fleet.cut_link("h2")
        fleet.kill_sshd("h3")

    try:
        with host_tool(fleet, "h2", "nvidia-smi", STALL), host_tool(fleet, "h3", "nvidia-smi", STALL):
            breaker = when_started(["h2", "h3"], fleet, break_hosts)
            err, run = failing_discover(checkout, capsys, rc=1)
            breaker.join()
    finally:
        fleet.restore_link("h2")
        fleet.start_host("h3")
        for name in ("h2", "h3"):
            started_marker(fleet, name).unlink(missing_ok=True)
    assert f"host node-2 ({fleet.host('h2').address}:22): {KEEPALIVE_LOST}" in err
    assert "host node-3" in err and "connection closed by the host before host program `probe.py` finished" in err
    assert "node-1" not in err and "Traceback" not in err
    assert run is not None and read_json(run / "node-1.json")["gpus"], "the healthy host's results were kept"
    assert snapshot(checkout / "config") == before


def test_a_hung_tool_is_a_host_failure_and_leaves_no_process(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The probe stops a tool after its own 60 s limit; the tool's children must not outlive the probe."""
    discover(checkout, capsys)
    hung = "#!/bin/sh\nsleep 3501\necho never\n"  # the shell waits on a child: killing the shell orphans it
    with host_tool(fleet, "h2", "nvidia-smi", hung):
        err, _ = failing_discover(checkout, capsys, rc=1)
        assert not gone(fleet, "h2", "sleep 3501", GUARD), "the hung tool is still running on the host"
    assert "host node-2: nvidia-smi: exit 124" in err and "timed out" in err


def test_fifty_megabytes_from_nvidia_smi_fail_that_host_at_the_output_limit(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    before = snapshot(checkout / "config")
    row = "0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H200, 143771, 00000000:19:00.0"
    flood = f"#!/bin/sh\nyes '{row}' | head -c 52428800\n"  # valid, duplicate rows: the quadratic case
    with host_tool(fleet, "h2", "nvidia-smi", flood):
        err, _ = failing_discover(checkout, capsys, rc=1)
        assert not gone(fleet, "h2", "GPU-00000000", GUARD)
    assert f"host node-2 ({fleet.host('h2').address}:22): host program `probe.py` printed more than " in err
    assert "(output limit)" in err and "node-1" not in err and "node-3" not in err
    assert snapshot(checkout / "config") == before


# --------------------------------------------------------------------------------------------- terminal safety

HOSTILE = "evil\\033]0;pwned\\007\\033[2J\\r\\nok   node-9     roles=router forged line\\033[0m"


def assert_no_controls(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text, repr(text)


def assert_terminal_safe(text: str) -> None:
    assert_no_controls(text)
    assert not any(line.startswith("ok   node-9") for line in text.splitlines()), "a host forged an output line"


def test_check_access_escapes_a_hostile_hostname(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    with host_tool(fleet, "h1", "hostname", f"#!/bin/sh\nprintf '{HOSTILE}\\n'\n"):
        rc, out, err = cli(checkout, "check-access", capsys=capsys)
    assert rc == 0, err
    assert_terminal_safe(out)
    [line] = [line for line in out.splitlines() if " node-1 " in line]
    assert "hostname=evil\\x1b]0;pwned\\x07\\x1b[2J\\r\\nok   node-9" in line
    assert len(out.splitlines()) == 3


def test_error_lines_escape_what_a_host_printed(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    discover(checkout, capsys)
    failing = f"#!/bin/sh\nprintf '{HOSTILE}\\n' >&2\nexit 9\n"
    with host_tool(fleet, "h2", "nvidia-smi", failing):
        err, run = failing_discover(checkout, capsys, rc=1)
    assert_terminal_safe(err)
    assert all(line.startswith("deploy-hosts discover: error: ") for line in err.splitlines())
    assert "host node-2: nvidia-smi: exit 9: evil\\x1b]0;pwned\\x07\\x1b[2J" in err
    assert run is not None
    assert_no_controls((run / "logs" / "node-2.log").read_text(encoding="utf-8").split("# probe stderr")[0])


def test_discover_summary_escapes_a_hostile_hostname(
    checkout: Path, fleet: SimFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    with host_tool(fleet, "h1", "hostname", f"#!/bin/sh\nprintf '{HOSTILE}\\n'\n"):
        rc, out, err = cli(checkout, "discover", capsys=capsys)
    assert rc == 0, err
    [run] = run_dirs(checkout)
    assert read_json(run / "node-1.json")["hostname"].startswith("evil\x1b]0;pwned\x07"), "files keep the value"
    assert_terminal_safe(out)

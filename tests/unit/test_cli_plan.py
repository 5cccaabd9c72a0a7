"""`deploy-hosts plan`: prints hosts with roles; bad input exits 2 with one line per problem, writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from narwhal_assets.cli.main import main
from narwhal_assets.local.checkout import Checkout

DEST_1 = "SENTINEL-DEST-ops@gpu-a.example"
DEST_2 = "SENTINEL-DEST-gpu-b-alias"
PASSWORD = "SENTINEL-PW-correct-horse"
ERR = "deploy-hosts plan: error: "


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A management checkout as the current directory, with its own DAGSTER_HOME and no NARWHAL_* leaks."""
    root = tmp_path / "checkout"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    for name in list(os.environ):
        if name.startswith("NARWHAL_"):
            monkeypatch.delenv(name)
    return root


def write_env(root: Path, text: str) -> None:
    (root / ".env").write_text(text, encoding="utf-8")


GOOD_ENV = (
    "# workstation access\n"
    f"NARWHAL_NODE_1_SSH='{DEST_1}'\n"
    f"export NARWHAL_NODE_2_SSH={DEST_2}\n"
    f"NARWHAL_NODE_2_SSH_PASSWORD='{PASSWORD}'\n"
)


def hosts_file(root: Path) -> Path:
    return root / "config" / "hosts.local.json"


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        assert "SENTINEL" not in text


def assert_no_secret_in_dagster_home() -> None:
    """Nothing Dagster stored (event log, run storage, logs), if anything, holds a destination or password."""
    home = Path(os.environ["DAGSTER_HOME"])
    for path in (p for p in home.rglob("*") if p.is_file()):
        assert b"SENTINEL" not in path.read_bytes(), path


def assert_no_dagster_run() -> None:
    """`plan` is a read-only check: it creates no Dagster run (nothing at all under DAGSTER_HOME)."""
    home = Path(os.environ["DAGSTER_HOME"])
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))


def test_plan_prints_hosts_with_roles(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_env(checkout, GOOD_ENV)
    assert main(["--root", str(checkout), "plan"]) == 0
    out, err = capsys.readouterr()
    hosts = [
        "  node-1       roles=router,engine-1          ssh_env=NARWHAL_NODE_1_SSH  auth=key/agent",
        "  node-2       roles=engine-2                 ssh_env=NARWHAL_NODE_2_SSH  "
        "auth=password (NARWHAL_NODE_2_SSH_PASSWORD)",
    ]
    assert out.splitlines() == [
        f"inventory {hosts_file(checkout)}: 2 physical host(s)",
        *hosts,
        f"derived from .env and not saved yet: `deploy-hosts discover` writes {hosts_file(checkout)}",
    ]
    assert err == ""
    assert_no_secrets(out, err)
    assert not hosts_file(checkout).exists() and not (checkout / "config").exists()
    assert_no_dagster_run()
    # Once an inventory is saved (by discovery's host_inventory asset), plan validates and prints that file.
    Checkout.open(checkout).save_inventory()
    assert main(["--root", str(checkout), "plan"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"inventory {hosts_file(checkout)}: 2 physical host(s)", *hosts]
    assert_no_dagster_run()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            f"NARWHAL_NODE_1_SSH='{DEST_1}'\nNARWHAL_NODE_2_SSH={DEST_2} $(whoami)\n",
            ["{env}:2: NARWHAL_NODE_2_SSH: more than one word after '='; quote the value"],
        ),
        (
            f"NARWHAL_NODE_1_SSH=~/{DEST_1}\n",
            ["{env}:1: NARWHAL_NODE_1_SSH: unquoted '~' would be expanded by the shell; quote the value"],
        ),
        (
            f"NARWHAL_ROUTER_SSH='{DEST_1}'\n",
            ["{env}: no NARWHAL_NODE_<n>_SSH destination is set"],
        ),
        (
            f"NARWHAL_NODE_1_SSH='{DEST_1}'\nNARWHAL_NODE_1_SSH_PASSWORD=\n",
            [
                "{env} (derived inventory): hosts[0].password_env: variable NARWHAL_NODE_1_SSH_PASSWORD is unset "
                "or empty (set it in .env)"
            ],
        ),
    ],
)
def test_bad_env_exits_2_and_writes_nothing(
    checkout: Path, capsys: pytest.CaptureFixture[str], env: str, expected: list[str]
) -> None:
    write_env(checkout, env)
    assert main(["--root", str(checkout), "plan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [ERR + line.format(env=checkout / ".env") for line in expected]
    assert not (checkout / "config").exists()
    assert_no_secrets(out, err)
    assert_no_dagster_run()


def test_bad_saved_inventory_reports_every_problem_and_keeps_the_file(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_env(checkout, GOOD_ENV.replace(PASSWORD, "") + f"NARWHAL_NODE_3_SSH='{DEST_1}'\n")
    saved = hosts_file(checkout)
    saved.parent.mkdir()
    content = (
        '{"schema": "narwhal.hosts", "schema_version": 1, "hosts": [\n'
        ' {"id": "node-1", "ssh_env": "NARWHAL_NODE_1_SSH", "roles": ["engine-1"]},\n'
        ' {"id": "node-1", "ssh_env": "NARWHAL_NODE_2_SSH", "password_env": "NARWHAL_NODE_2_SSH_PASSWORD",'
        ' "roles": ["engine-2"]}\n'
        "]}\n"
    )
    saved.write_text(content)
    assert main(["--root", str(checkout), "plan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        ERR + f"{saved}: hosts[1].id: duplicate host id 'node-1'",
        ERR + f"{saved}: hosts[1].password_env: variable NARWHAL_NODE_2_SSH_PASSWORD is unset or empty (set it in "
        ".env)",
        ERR + f"{saved}: hosts: NARWHAL_NODE_3_SSH is set but no host owns role 'engine-3'; add it to the entry "
        "of its machine (or remove the file to derive the inventory again)",
        ERR + f"{saved}: hosts: no host owns the 'router' role",
    ]
    assert saved.read_text() == content
    assert_no_secrets(out, err)


def test_saved_inventory_with_wrong_schema(checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_env(checkout, GOOD_ENV)
    saved = hosts_file(checkout)
    saved.parent.mkdir()
    saved.write_text('{"schema": "narwhal.hosts", "hosts": [{"id": "node-1", "roles": ["router"]}]}')
    assert main(["--root", str(checkout), "plan"]) == 2
    _, err = capsys.readouterr()
    assert err.splitlines() == [ERR + f"{saved}: hosts[0].ssh_env: Field required"]


@pytest.mark.parametrize("command", ["plan", "discover"])
def test_a_password_variable_named_as_ssh_env_is_refused(
    checkout: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """`ssh_env` naming a password variable passed `plan`; discovery then sent the password
    to the name resolver, into error text and Dagster's storage. Both refuse it before any connection."""
    write_env(checkout, GOOD_ENV)
    saved = hosts_file(checkout)
    saved.parent.mkdir()
    content = (
        '{"schema": "narwhal.hosts", "schema_version": 1, "hosts": [\n'
        ' {"id": "node-1", "ssh_env": "NARWHAL_NODE_1_SSH", "roles": ["router", "engine-1"]},\n'
        ' {"id": "node-2", "ssh_env": "NARWHAL_NODE_2_SSH_PASSWORD", "roles": ["engine-2"]}\n'
        "]}\n"
    )
    saved.write_text(content)
    assert main(["--root", str(checkout), command]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"deploy-hosts {command}: error: {saved}: hosts[1].ssh_env: must be the destination variable of a role "
        "of host 'node-2' (NARWHAL_NODE_2_SSH)"
    ]
    assert saved.read_text() == content
    assert_no_secrets(out, err)
    assert_no_secret_in_dagster_home()


BIG_MODEL = "m" * (1 << 20)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Once, a 1 MB model name produced a 1 MB fleet and a 3 MB launch file.
        (
            GOOD_ENV + f"NARWHAL_ENGINE_MODEL_NAME={BIG_MODEL[:1000]}\n",
            "{env}:5: NARWHAL_ENGINE_MODEL_NAME: value is longer than 256 bytes (see docs/limits.md)",
        ),
        (
            GOOD_ENV + f"NARWHAL_NODE_2_RUN_DIR='/{'r' * 1024}'\n",
            "{env}:5: NARWHAL_NODE_2_RUN_DIR: value is longer than 1024 bytes (see docs/limits.md)",
        ),
        (
            GOOD_ENV.replace(PASSWORD, PASSWORD + "x" * 600),
            "{env}:4: NARWHAL_NODE_2_SSH_PASSWORD: value is longer than 512 bytes (see docs/limits.md)",
        ),
        (
            GOOD_ENV + f"NARWHAL_ROUTER_URL='{'u' * 9000}'\n",
            "{env}:5: NARWHAL_ROUTER_URL: value is longer than 8192 bytes (see docs/limits.md)",
        ),
        (GOOD_ENV + "# padding\n" * 10_000, "{env}: more than 10000 lines (see docs/limits.md)"),
        (GOOD_ENV + f"# {BIG_MODEL}\n", "{env}: larger than 1048576 bytes (see docs/limits.md)"),
        # Once, an empty destination silently dropped that engine.
        (
            GOOD_ENV + "NARWHAL_NODE_3_SSH=\n",
            "{env}: NARWHAL_NODE_3_SSH is set but empty, which would drop role engine-3; give it a destination or "
            "remove it",
        ),
    ],
)
def test_values_over_their_limit_and_empty_destinations_exit_2(
    checkout: Path, capsys: pytest.CaptureFixture[str], env: str, expected: str
) -> None:
    write_env(checkout, env)
    assert main(["--root", str(checkout), "plan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [ERR + expected.format(env=checkout / ".env")]
    assert not (checkout / "config").exists()
    assert_no_secrets(out, err)


def test_a_process_value_over_its_limit_exits_2(
    checkout: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_env(checkout, GOOD_ENV)
    monkeypatch.setenv("NARWHAL_ENGINE_MODEL_NAME", BIG_MODEL)
    monkeypatch.setenv("UNRELATED_BIG_VARIABLE", BIG_MODEL)  # not this project's: left alone
    assert main(["--root", str(checkout), "plan"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        ERR + "process environment: NARWHAL_ENGINE_MODEL_NAME: value is longer than 256 bytes (see docs/limits.md)"
    ]
    assert not (checkout / "config").exists()


def run_module(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    return subprocess.run(
        [sys.executable, "-m", "narwhal_assets", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_plan_as_a_subprocess(checkout: Path) -> None:
    write_env(checkout, GOOD_ENV)
    done = run_module(checkout, "plan")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"inventory {hosts_file(checkout)}: 2 physical host(s)"
    assert [line.split()[:2] for line in lines[1:-1]] == [
        ["node-1", "roles=router,engine-1"],
        ["node-2", "roles=engine-2"],
    ]
    assert_no_secrets(done.stdout, done.stderr)
    assert not hosts_file(checkout).exists()

    write_env(checkout, f"NARWHAL_NODE_1_SSH='{DEST_1}'\nNARWHAL_NODE_2_SSH=`cat {PASSWORD}`\n")
    done = run_module(checkout, "plan")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        ERR + f"{checkout / '.env'}:2: NARWHAL_NODE_2_SSH: needs a shell to evaluate (expansion or command "
        "substitution)"
    ]
    assert not hosts_file(checkout).exists()
    assert_no_secrets(done.stdout, done.stderr)
    assert_no_dagster_run()

"""An operator's first day: bad input answers at once (exit 2, the fix named, nothing written, Dagster not
imported), management access never stays in a process environment, and the small things that broke.

Commands run as new processes, as an operator starts them, under a usual umask and without NARWHAL_* or
DAGSTER_* in their environment; each reports whether Dagster was imported before it answered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pexpect
import pytest
from fleetsim.__main__ import stop_command
from helpers.git_repo import git_checkout

from narwhal_assets.cli.main import build_parser
from narwhal_assets.core.discovery.manifest import CONFIG_FORMAT, DiscoveryManifest
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.prepared_run.prepare_inputs import discovery_inputs_digest, input_digests
from narwhal_assets.core.roles import Role
from narwhal_assets.local.checkout import Checkout, missing_run_problem, prepared_run_names
from narwhal_assets.local.process_env import AccessInEnvironmentWarning, access_variables, scrub_access_variables
from narwhal_assets.workflows.shell import role_shell_command

PASSWORD = "SENTINEL-PW-first-day"
DEST_1 = "SENTINEL-DEST-ops@gpu-a.example"
DEST_2 = "SENTINEL-DEST-gpu-b"
GOOD_ENV = f"NARWHAL_NODE_1_SSH='{DEST_1}'\nNARWHAL_NODE_2_SSH='{DEST_2}'\nNARWHAL_NODE_2_SSH_PASSWORD='{PASSWORD}'\n"
# Runs a command in-process in a new interpreter, then says whether Dagster had been imported by then.
PROBE = (
    "import sys\nfrom narwhal_assets.cli.main import main\nrc = main(sys.argv[1:])\n"
    "print('DAGSTER-IMPORTED' if 'dagster' in sys.modules else 'DAGSTER-NOT-IMPORTED')\nsys.exit(rc)\n"
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "DAGSTER_"))}
    return {**env, **extra}


def deploy_hosts(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".env")


def assert_input_error(done: subprocess.CompletedProcess[str], root: Path, before: list[str]) -> None:
    """Exit 2, one error line per problem, no traceback, no secret, Dagster never imported, nothing written."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "SENTINEL" not in done.stdout + done.stderr
    assert "DAGSTER-NOT-IMPORTED" in done.stdout, done.stderr
    assert not (root / "runs" / "dagster").exists()
    assert written(root) == before


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    path = tmp_path / "not-a-checkout"
    path.mkdir()
    return path


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text(GOOD_ENV)
    return root


@pytest.mark.parametrize("command", [["discover"], ["prepare"], ["status"], ["check-access"], ["ui"]])
def test_no_env_says_the_file_is_missing_and_how_to_point_at_a_checkout(empty_dir: Path, command: list[str]) -> None:
    done = deploy_hosts(empty_dir, *command)
    assert_input_error(done, empty_dir, [])
    assert f"{empty_dir / '.env'} does not exist" in done.stderr
    for fix in ("--root DIR", "NARWHAL_ROOT", ".env.example"):
        assert fix in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_prepare_with_a_revision_typo_creates_no_run(checkout: Path) -> None:
    with (checkout / ".env").open("a") as env:
        env.write("NARWHAL_DEPLOYMENT_REVISION=0123abc\n")
    done = deploy_hosts(checkout, "prepare")
    assert_input_error(done, checkout, [])
    assert "NARWHAL_DEPLOYMENT_REVISION must be a full 40- or 64-hex commit id" in done.stderr
    assert "git rev-parse HEAD" in done.stderr


def test_prepare_into_an_existing_out_creates_no_run(checkout: Path) -> None:
    out = checkout / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("operator's file\n")
    before = written(checkout)
    done = deploy_hosts(checkout, "prepare", "--out", str(out))
    assert_input_error(done, checkout, before)
    assert f"--out {out}: exists and is not an empty directory; use a new output directory" in done.stderr
    assert (out / "keep.txt").read_text() == "operator's file\n"


def test_prepare_after_env_changed_names_the_variables_never_their_values(checkout: Path) -> None:
    """A discovery run's manifest as discovery writes it (no host contacted), then `.env` edited."""
    with (checkout / ".env").open("a") as env:
        env.write(f"NARWHAL_DEPLOYMENT_REVISION={git_checkout(checkout)}\n")
    settings = Settings.load(checkout, environ={})
    inventory = Checkout.from_settings(settings).inventory
    run = checkout / "runs" / "discovery" / "20260101T000000Z-0a0b0c"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(render_json(DiscoveryManifest(
        config_format=CONFIG_FORMAT, files={}, inputs_sha256=discovery_inputs_digest(settings, inventory),
        inputs=input_digests(settings, inventory, "5a" * 32),
    )))  # fmt: skip
    with (checkout / ".env").open("a") as env:
        env.write("NARWHAL_NODE_2_SSH='SENTINEL-DEST-moved'\nNARWHAL_ENGINE_MODEL_NAME='SENTINEL-model'\n"
                  "NARWHAL_NODE_2_SSH_PASSWORD='SENTINEL-PW-rotated'\n")  # fmt: skip
    before = written(checkout)
    done = deploy_hosts(checkout, "prepare")
    assert_input_error(done, checkout, before)
    assert done.stderr == (f"deploy-hosts prepare: error: changed since discovery run {run}: "
                           "NARWHAL_ENGINE_MODEL_NAME (set since), NARWHAL_NODE_2_SSH; run `deploy-hosts discover` "
                           "before preparing\n")  # fmt: skip


def test_prepare_from_a_config_set_of_the_previous_format_is_refused_in_one_line(checkout: Path) -> None:
    """A set discovered before launch records took the serving fleet's shape is never read as today's."""
    with (checkout / ".env").open("a") as env:
        env.write(f"NARWHAL_DEPLOYMENT_REVISION={git_checkout(checkout)}\n")
    run = checkout / "runs" / "discovery" / "20260101T000000Z-0a0b0c"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"schema": "narwhal.discovery-manifest", "schema_version": 1, "files": {}}\n')
    before = written(checkout)
    done = deploy_hosts(checkout, "prepare")
    assert_input_error(done, checkout, before)
    assert done.stderr == (f"deploy-hosts prepare: error: discovery run {run}: config set discovered with format 1, "
                           "re-run discover (this version prepares format 2: `deploy-hosts discover`)\n")  # fmt: skip


def test_discover_with_a_missing_engine_setting_writes_nothing(checkout: Path) -> None:
    """No inventory and no run directory: a saved inventory would outlive the fix (and block a colocation
    chosen in .env afterwards)."""
    before = written(checkout)
    done = deploy_hosts(checkout, "discover")
    assert_input_error(done, checkout, before)
    assert not (checkout / "config" / "hosts.local.json").exists() and not (checkout / "runs").exists()
    assert "engine-1: NARWHAL_MODEL_DIR is unset" in done.stderr
    with (checkout / ".env").open("a") as env:  # colocate engine-2 with engine-1, and a skip of NIXL's check
        env.write(f"NARWHAL_NODE_2_SSH='{DEST_1}'\nNARWHAL_ENGINE_ENV='VLLM_NIXL_SKIP_COMPATIBILITY_CHECK=1'\n")
    done = deploy_hosts(checkout, "discover")
    assert_input_error(done, checkout, before)
    assert "distinct" not in done.stderr  # the inventory is derived afresh: nothing saved blocks the colocation
    assert "VLLM_NIXL_SKIP_COMPATIBILITY_CHECK turns off NIXL's compatibility check" in done.stderr


def test_discover_with_a_broken_inventory_creates_no_run(checkout: Path) -> None:
    config = checkout / "config"
    config.mkdir()
    (config / "hosts.local.json").write_text('{"hosts": [{"id": "node-1", "ssh_env": "NARWHAL_NODE_1_SSH", '
                                             '"roles": ["router", "engine-1"]}]}')  # fmt: skip
    before = written(checkout)
    done = deploy_hosts(checkout, "discover")
    assert_input_error(done, checkout, before)
    assert "no host owns role 'engine-2'" in done.stderr


@pytest.mark.parametrize("command", ["check-access", "status"])
def test_unknown_role_lists_the_known_roles(checkout: Path, command: str) -> None:
    done = deploy_hosts(checkout, command, "--role", "engin-2")
    assert_input_error(done, checkout, [])
    assert "--role engin-2: inventory: no host owns role 'engin-2' (known: router, engine-1, engine-2)" in done.stderr


def test_missing_run_lists_the_prepared_runs(checkout: Path) -> None:
    settings = Settings.load(checkout, environ={})
    base = checkout / "runs" / "deployment-env"
    assert prepared_run_names(settings) == []
    assert "none yet (`deploy-hosts prepare` makes one)" in missing_run_problem(settings, base / "nope")
    for index, name in enumerate(["2025-12-01", "2025-11-30", "unfinished"]):
        (base / name).mkdir(parents=True)
        if name != "unfinished":
            (base / name / "manifest.json").write_text("{}")
            os.utime(base / name / "manifest.json", (1_700_000_000 - index * 10,) * 2)
    line = missing_run_problem(settings, base / "2025-12-02")
    assert line == (f"--run {base / '2025-12-02'}: does not exist; prepared runs in {base} (oldest first): "
                    "2025-11-30, 2025-12-01")  # fmt: skip


def test_access_variables_are_named_and_removed_never_shown(checkout: Path) -> None:
    environ = {"NARWHAL_NODE_2_SSH_PASSWORD": PASSWORD, "NARWHAL_ROUTER_SSH_PASSWORD": "other", "COPY": DEST_1,
               "NARWHAL_NODE_1_SSH": DEST_1, "NARWHAL_NODE_3_SSH": "ops@elsewhere", "HOME": "/root"}  # fmt: skip
    assert access_variables(environ, checkout) == [
        "COPY", "NARWHAL_NODE_1_SSH", "NARWHAL_NODE_2_SSH_PASSWORD", "NARWHAL_ROUTER_SSH_PASSWORD",
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        removed = scrub_access_variables(environ, checkout)
        assert scrub_access_variables(environ, checkout) == []  # said once: nothing is left the second time
    assert environ == {"NARWHAL_NODE_3_SSH": "ops@elsewhere", "HOME": "/root"}
    assert len(caught) == 1 and caught[0].category is AccessInEnvironmentWarning
    message = str(caught[0].message)
    assert all(name in message for name in removed)
    assert "SENTINEL" not in message and "other" not in message.split("removed ", 1)[0]


def test_loading_the_code_location_drops_access_a_dagster_command_copied_from_env(checkout: Path) -> None:
    """What `dagster dev` run inside the checkout would do: its environment holds the `.env` values."""
    env = clean_env(NARWHAL_ROOT=str(checkout), NARWHAL_NODE_1_SSH=DEST_1, NARWHAL_NODE_2_SSH_PASSWORD=PASSWORD,
                    DAGSTER_HOME=str(checkout.parent / "home"))  # fmt: skip
    code = ("import os, narwhal_assets.definitions\nnarwhal_assets.definitions.defs()\n"
            "print(sorted(n for n in os.environ if n.startswith('NARWHAL_NODE')))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=checkout.parent, env=env, capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
    assert done.stderr.count("AccessInEnvironmentWarning") == 1, done.stderr
    assert "NARWHAL_NODE_1_SSH, NARWHAL_NODE_2_SSH_PASSWORD" in done.stderr
    assert "SENTINEL" not in done.stdout + done.stderr


def test_prune_keeps_five_deployments_unless_told() -> None:
    assert build_parser().parse_args(["prune", "--dry-run"]).keep == 5
    assert build_parser().parse_args(["prune", "--keep", "2"]).keep == 2


def test_ui_refuses_a_port_in_use_before_starting_anything(checkout: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = deploy_hosts(checkout, "ui", "--port", str(port))
    assert_input_error(done, checkout, [])
    assert f"--host 127.0.0.1 --port {port}: cannot listen there" in done.stderr


def test_fleetsim_prints_a_stop_command_that_works_from_anywhere(tmp_path: Path) -> None:
    command = stop_command(Path("relative/fleet"))
    assert command.startswith(f"{sys.executable} -m fleetsim stop --dir /")
    assert str(Path("relative/fleet").resolve()) in command
    done = subprocess.run([*command.split()[:3], "--help"], cwd=tmp_path, capture_output=True, text=True,
                          check=False, env=clean_env())  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_role_shell_prompt_names_role_and_host(tmp_path: Path) -> None:
    """The remote command run by a local bash: a deployed checkout with a real venv's `activate`."""
    checkout = tmp_path / "Narwhal-deploy" / "current" / "checkout"
    (checkout / "runs" / "deployment").mkdir(parents=True)
    (checkout.parent / "installed").write_text("")
    (checkout / "runs" / "deployment" / ".env.engine-2").write_text("export NARWHAL_ROLE='engine-2'\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv")], check=True)
    remote = role_shell_command("Narwhal-deploy/current", Role.engine(2), None, "node-2")
    shell = pexpect.spawn("bash", ["-c", remote], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"],
                                                       "TERM": "dumb"}, encoding="utf-8", timeout=30)  # fmt: skip
    try:
        shell.expect_exact("(engine-2@node-2) ")
        shell.expect(r"Narwhal-deploy/current/checkout \(\.venv\) [$#] ")  # `#` for root
        shell.sendline("echo role=$NARWHAL_ROLE")
        shell.expect_exact("role=engine-2")
    finally:
        shell.sendline("exit")
        shell.close(force=True)

"""Layered settings: default < config/deployment.env < .env < process environment, and path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.env_checkout import run_cli, write_checkout

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.settings import PATH_DEFAULTS, Layer, Settings


def checkout(tmp_path: Path, dotenv: str = "", deployment_env: str = "") -> Path:
    (tmp_path / "config").mkdir(exist_ok=True)
    if dotenv:
        (tmp_path / ".env").write_text(dotenv, encoding="utf-8")
    if deployment_env:
        (tmp_path / "config" / "deployment.env").write_text(deployment_env, encoding="utf-8")
    return tmp_path


def test_precedence_and_reported_layer(tmp_path: Path) -> None:
    root = checkout(
        tmp_path,
        dotenv="export B=dotenv\nC=dotenv\nD=dotenv\n",
        deployment_env="A=discovered\nB=discovered\nC=discovered\n",
    )
    defaults = {"A": "default", "B": "default", "E": "default"}
    s = Settings.load(root, environ={"C": "process", "F": ""}, defaults=defaults)
    assert s.lookup("E") == ("default", Layer.DEFAULT)
    assert s.lookup("A") == ("discovered", Layer.DISCOVERED)
    assert s.lookup("B") == ("dotenv", Layer.DOTENV)
    assert s.lookup("D") == ("dotenv", Layer.DOTENV)
    assert s.lookup("C") == ("process", Layer.PROCESS)
    assert s.lookup("F") == ("", Layer.PROCESS)  # an empty value still wins and is reported
    assert s.lookup("MISSING") is None
    assert s.get("C") == "process"
    assert s.get("MISSING") is None
    assert s.get("MISSING", "fallback") == "fallback"
    assert s.names() == {"A", "B", "C", "D", "E", "F"}
    layers = dict(s.layers)
    assert layers[Layer.DISCOVERED] == {"A": "discovered", "B": "discovered", "C": "discovered"}
    assert layers[Layer.DOTENV] == {"B": "dotenv", "C": "dotenv", "D": "dotenv"}
    assert [layer for layer, _ in s.layers] == [Layer.DEFAULT, Layer.DISCOVERED, Layer.DOTENV, Layer.PROCESS]


def test_process_environment_is_os_environ_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = checkout(tmp_path, dotenv="NARWHAL_T_VAR=dotenv\n")
    assert Settings.load(root).lookup("NARWHAL_T_VAR") == ("dotenv", Layer.DOTENV)
    monkeypatch.setenv("NARWHAL_T_VAR", "process")
    assert Settings.load(root).lookup("NARWHAL_T_VAR") == ("process", Layer.PROCESS)


def test_missing_files_are_empty_layers(tmp_path: Path) -> None:
    s = Settings.load(tmp_path, environ={})
    assert s.names() == set()
    assert s.root == tmp_path.resolve()


def test_bad_dotenv_names_the_file_and_line(tmp_path: Path) -> None:
    root = checkout(tmp_path, dotenv="A=1\nB=$(id)\n", deployment_env="C=two words\n")
    with pytest.raises(InputError) as info:
        Settings.load(root, environ={})
    # Both files' problems are reported together, config/deployment.env first.
    assert info.value.problems == [
        f"{root / 'config' / 'deployment.env'}:1: C: more than one word after '='; quote the value",
        f"{root / '.env'}:2: B: needs a shell to evaluate (expansion or command substitution)",
    ]
    (root / "config" / "deployment.env").unlink()
    with pytest.raises(InputError) as info:
        Settings.load(root, environ={})
    assert info.value.problems == [
        f"{root / '.env'}:2: B: needs a shell to evaluate (expansion or command substitution)"
    ]


def test_path_defaults_resolve_against_root(tmp_path: Path) -> None:
    s = Settings.load(tmp_path, environ={})
    assert s.hosts_path == tmp_path.resolve() / "config" / "hosts.local.json"
    assert s.known_hosts_path == tmp_path.resolve() / "config" / "ssh.known_hosts"
    assert s.fleet_path == tmp_path.resolve() / "config" / "fleet.json"
    assert s.launch_config_path == tmp_path.resolve() / "config" / "engine-launch.local.json"
    for name, default in PATH_DEFAULTS.items():
        assert s.path(name) == tmp_path.resolve() / default


def test_path_values_from_each_layer(tmp_path: Path) -> None:
    root = checkout(
        tmp_path,
        dotenv="NARWHAL_HOSTS=private/hosts.json\nNARWHAL_FLEET=''\n",
        deployment_env="NARWHAL_SSH_KNOWN_HOSTS=config/../trust/kh\n",
    )
    absolute = tmp_path / "elsewhere" / "fleet.json"
    s = Settings.load(root, environ={"NARWHAL_LAUNCH_CONFIG": str(absolute)})
    assert s.hosts_path == root.resolve() / "private" / "hosts.json"
    assert s.known_hosts_path == root.resolve() / "trust" / "kh"
    assert s.fleet_path == root.resolve() / "config" / "fleet.json"  # empty means the default
    assert s.launch_config_path == absolute


def test_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "co").mkdir()
    monkeypatch.chdir(tmp_path)
    s = Settings.load("co", environ={"NARWHAL_HOSTS": "h.json"})
    assert s.root == tmp_path.resolve() / "co"
    assert s.hosts_path == tmp_path.resolve() / "co" / "h.json"


def test_quoted_tilde_stays_literal_as_in_bash(tmp_path: Path) -> None:
    root = checkout(tmp_path, dotenv="NARWHAL_HOSTS='~/hosts.json'\n")
    assert Settings.load(root, environ={}).hosts_path == root.resolve() / "~" / "hosts.json"


def test_unknown_path_variable_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        Settings.load(tmp_path, environ={}).path("NARWHAL_NOT_A_PATH")


def test_ssh_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings.load(tmp_path, environ={}).ssh_config_path is None
    default = tmp_path / "home" / ".ssh" / "config"
    default.parent.mkdir(parents=True)
    default.write_text("Host x\n")
    assert Settings.load(tmp_path, environ={}).ssh_config_path == default
    (tmp_path / "my_ssh_config").write_text("Host y\n")
    s = Settings.load(tmp_path, environ={"NARWHAL_SSH_CONFIG": "my_ssh_config"})
    assert s.ssh_config_path == tmp_path.resolve() / "my_ssh_config"
    with pytest.raises(InputError, match=r"^NARWHAL_SSH_CONFIG: .*absent does not exist"):
        _ = Settings.load(tmp_path, environ={"NARWHAL_SSH_CONFIG": "absent"}).ssh_config_path


def test_a_process_value_equal_to_dotenv_is_attributed_to_dotenv(tmp_path: Path) -> None:
    """Dagster's CLI copies `.env` into the process environment; sources must still say `.env`."""
    (tmp_path / ".env").write_text("NARWHAL_MAX_NUM_SEQS=16\nNARWHAL_GPU_IDS=0\n")
    settings = Settings.load(tmp_path, environ={"NARWHAL_MAX_NUM_SEQS": "16", "NARWHAL_GPU_IDS": "1"})
    assert settings.lookup("NARWHAL_MAX_NUM_SEQS") == ("16", Layer.DOTENV)
    assert settings.lookup("NARWHAL_GPU_IDS") == ("1", Layer.PROCESS)


def test_process_values_are_held_to_their_limits_with_the_files_problems(tmp_path: Path) -> None:
    """`NARWHAL_*` process values are bounded too; every problem is reported at once."""
    root = checkout(tmp_path, dotenv=f"NARWHAL_RUN_DIR='/{'r' * 1024}'\n")
    environ = {
        "NARWHAL_NODE_1_SSH_PASSWORD": "p" * 513,
        "NARWHAL_ENGINE_MODEL_NAME": "m" * 256,
        "PATH": "x" * 100_000,  # not this project's variable: not read, not bounded
    }
    with pytest.raises(InputError) as info:
        Settings.load(root, environ=environ)
    assert info.value.problems == [
        f"{root / '.env'}:1: NARWHAL_RUN_DIR: value is longer than 1024 bytes (see docs/limits.md)",
        "process environment: NARWHAL_NODE_1_SSH_PASSWORD: value is longer than 512 bytes (see docs/limits.md)",
    ]
    (root / ".env").unlink()
    del environ["NARWHAL_NODE_1_SSH_PASSWORD"]
    assert Settings.load(root, environ=environ).get("NARWHAL_ENGINE_MODEL_NAME") == "m" * 256


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_ssh_config_naming_a_missing_file_or_a_directory_exits_2_naming_the_variable(
    tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "ssh_config"
    if kind == "directory":
        target.mkdir()
    root = write_checkout(tmp_path / "c", f"NARWHAL_SSH_CONFIG={target}")
    with pytest.raises(InputError, match=r"^NARWHAL_SSH_CONFIG: .* (does not exist|is a directory)"):
        _ = Settings.load(root).ssh_config_path
    done = run_cli(root, "check-access", "--timeout", "2")
    assert done.returncode == 2, done.stderr
    assert "error: NARWHAL_SSH_CONFIG:" in done.stderr and "cannot connect" not in done.stderr


def test_ssh_config_default_and_relative_values(tmp_path: Path) -> None:
    root = write_checkout(tmp_path / "c", "NARWHAL_SSH_CONFIG=conf/ssh_config")
    (root / "conf").mkdir()
    (root / "conf" / "ssh_config").write_text("Host x\n  HostName 10.0.0.1\n")
    assert Settings.load(root).ssh_config_path == root / "conf" / "ssh_config"
    unset = write_checkout(tmp_path / "d")
    home = Path("~/.ssh/config").expanduser()
    assert Settings.load(unset).ssh_config_path == (home if home.is_file() else None)

"""The standalone engine-host tools run on a real test host over SSH, fed by a real discovery.

`launch_engine.py check` must pass on the approved host and refuse a changed model `config.json` and a
tampered launcher snapshot; `start` must hand the planned command to (the host's fake) docker.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest
from fleetsim import SimFleet

from narwhal_assets.cli.main import main
from narwhal_assets.core.inputs.envfile import render_exports
from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.jsonfile import load_json_model, render_json
from narwhal_assets.core.launch.launch_records import engine_launch_file
from narwhal_assets.core.launch.models import EngineLaunchConfig
from narwhal_assets.local.checkout import Checkout
from narwhal_assets.ssh.access import host_accesses, make_connector
from narwhal_assets.ssh.transport import HostConnection
from narwhal_assets.ssh.trust import TrustMode

MODEL = "tiny"
CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 4096}
TOOLS = "tools"


@pytest.fixture
def discovered(tmp_path: Path, sim_fleet_factory: Callable[..., SimFleet]) -> tuple[SimFleet, Path]:
    fleet = sim_fleet_factory()
    fleet.add_host("h1")
    fleet.add_host("h2")
    fleet.start()
    fleet.write_model(MODEL, {"weights.bin": b"\x01" * 4096}, CONFIG)
    root = tmp_path / "checkout"
    root.mkdir()
    lines = fleet.env_lines({"router": "h1", "engine-1": "h1", "engine-2": "h2"})
    lines += [f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}", "NARWHAL_ENGINE_MODEL_NAME=tiny",
              f"NARWHAL_MODEL_DIR=/srv/models/{MODEL}", "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
              "NARWHAL_FABRIC_INTERFACE=fab0"]  # fmt: skip
    (root / ".env").write_text("\n".join(lines) + "\n")
    assert main(["--root", str(root), "discover"]) == 0
    return fleet, root


def launcher_source() -> bytes:
    return resources.files("narwhal_assets.host.tools").joinpath("launch_engine.py").read_bytes()


def install_launcher(connection: HostConnection, root: Path, source: bytes) -> str:
    """Put the launcher snapshot, the per-engine launch file and a role file on the host, as install will."""
    settings = Settings.load(root)
    config = load_json_model(settings.launch_config_path, EngineLaunchConfig)
    launch_file = engine_launch_file(config, 1, "prefill")
    connection.run(f"mkdir -p -m 0700 {TOOLS}")
    connection.put(source, f"{TOOLS}/launch_engine.py")
    connection.put(render_json(launch_file).encode(), f"{TOOLS}/engine-launch.engine-1.json")
    role = {
        "NARWHAL_ENGINE_IMAGE": settings.get("NARWHAL_NODE_1_ENGINE_IMAGE") or "",
        "NARWHAL_MODEL_DIR": f"/srv/models/{MODEL}",
        "NARWHAL_MODEL_CONFIG_SHA256": settings.get("NARWHAL_NODE_1_MODEL_CONFIG_SHA256") or "",
        "NARWHAL_ENGINE_LAUNCHER_SHA256": hashlib.sha256(launcher_source()).hexdigest(),
        "NARWHAL_ENGINE_LAUNCH_CONFIG": f"{TOOLS}/engine-launch.engine-1.json",
        "NARWHAL_RUN_DIR": "/var/tmp/narwhal-run",
    }
    connection.put(render_exports(role).encode(), f"{TOOLS}/.env.engine-1")
    return f"set -a; . {TOOLS}/.env.engine-1; set +a; python3 {TOOLS}/launch_engine.py"


def connect_engine_1(root: Path) -> HostConnection:
    settings = Settings.load(root)
    entry = Checkout.from_settings(settings).inventory.host_for_role("engine-1")
    return make_connector(settings, TrustMode.STRICT).connect(host_accesses(settings, [entry])[0])


def test_check_passes_on_the_approved_host_and_start_runs_the_planned_container(
    discovered: tuple[SimFleet, Path],
) -> None:
    fleet, root = discovered
    with connect_engine_1(root) as connection:
        launcher = install_launcher(connection, root, launcher_source())
        checked = connection.run(f"{launcher} check")
        assert checked.rc == 0, checked.text() + checked.stderr.decode()
        planned = json.loads(connection.run(f"{launcher} plan").text())
        started = connection.run(f"{launcher} start")
        assert started.rc == 0, started.stderr.decode()
        runs = [json.loads(line) for line in connection.run("cat ~/.fake-docker-runs.jsonl").text().splitlines()]
    image = fleet.host("h1").image_id
    assert image in planned["argv"] and "serve" in planned["argv"]
    assert "--max-num-seqs" in planned["argv"] and "--kv-transfer-config" in planned["argv"]
    assert len(runs) == 1 and runs[0] == planned["argv"][1:]  # docker's argv as planned, without "docker"


def test_check_refuses_a_changed_model_config(discovered: tuple[SimFleet, Path]) -> None:
    fleet, root = discovered
    config_path = fleet.model_path("h1", MODEL) / "config.json"
    config_path.write_text(json.dumps({**CONFIG, "max_position_embeddings": 8192}))
    with connect_engine_1(root) as connection:
        launcher = install_launcher(connection, root, launcher_source())
        checked = connection.run(f"{launcher} check")
    output = checked.text() + checked.stderr.decode()
    assert checked.rc != 0
    assert "model config" in output and "NARWHAL_MODEL_CONFIG_SHA256" in output


def test_check_refuses_a_tampered_launcher_snapshot(discovered: tuple[SimFleet, Path]) -> None:
    _, root = discovered
    tampered = launcher_source() + b"\n# tampered\n"
    with connect_engine_1(root) as connection:
        launcher = install_launcher(connection, root, tampered)
        checked = connection.run(f"{launcher} check")
        started = connection.run(f"{launcher} start")
        docker_runs = connection.run("cat ~/.fake-docker-runs.jsonl 2>/dev/null | wc -l").text().strip()
    output = checked.text() + checked.stderr.decode()
    assert checked.rc != 0 and "launcher" in output and "NARWHAL_ENGINE_LAUNCHER_SHA256" in output
    assert started.rc != 0 and docker_runs == "0"


# --- RDMA: the verbs character devices discovery observes reach the launch record and the container ------------


@pytest.fixture(scope="module")
def rdma_fleet(sim_fleet_factory: Callable[..., SimFleet]) -> SimFleet:
    """h1 and h2 with an ACTIVE InfiniBand port and its /dev/infiniband nodes (fleetsim's fake HCA); h3 without."""
    fleet = sim_fleet_factory()
    fleet.add_host("h1", rdma=True)
    fleet.add_host("h2", rdma=True)
    fleet.add_host("h3")
    fleet.start()
    fleet.write_model(MODEL, {"weights.bin": b"\x02" * 4096}, CONFIG)
    return fleet


def rdma_checkout(root: Path, fleet: SimFleet, engine_2_host: str) -> Path:
    root.mkdir()
    lines = fleet.env_lines({"router": "h1", "engine-1": "h1", "engine-2": engine_2_host})
    lines += [f"NARWHAL_ENGINE_IMAGE={fleet.host('h1').image_ref}", "NARWHAL_ENGINE_MODEL_NAME=tiny",
              f"NARWHAL_MODEL_DIR=/srv/models/{MODEL}", "NARWHAL_RUN_DIR=/var/tmp/narwhal-run",
              "NARWHAL_FABRIC_INTERFACE=fab0", "NARWHAL_TRANSFER_TRANSPORT=ucx_rdma"]  # fmt: skip
    (root / ".env").write_text("\n".join(lines) + "\n")
    return root


def test_rdma_engines_map_the_verbs_devices_discovery_observed(rdma_fleet: SimFleet, tmp_path: Path) -> None:
    root = rdma_checkout(tmp_path / "checkout", rdma_fleet, "h2")
    assert main(["--root", str(root), "discover"]) == 0
    config = load_json_model(Settings.load(root).launch_config_path, EngineLaunchConfig)
    for engine in ("engine-1", "engine-2"):
        transfer = config.engines[engine].transfer
        assert (transfer.transport, transfer.net_devices) == ("ucx_rdma", "mlx5_0:1")
        assert transfer.devices == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]
    with connect_engine_1(root) as connection:
        launcher = install_launcher(connection, root, launcher_source())
        planned = json.loads(connection.run(f"{launcher} plan").text())
    devices = [planned["argv"][i + 1] for i, arg in enumerate(planned["argv"]) if arg == "--device"]
    assert devices[-2:] == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]
    assert "UCX_TLS" in planned["environment"]


def test_rdma_on_a_host_without_an_active_port_is_refused_naming_the_transport(
    rdma_fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = rdma_checkout(tmp_path / "checkout", rdma_fleet, "h3")
    assert main(["--root", str(root), "discover"]) == 2
    err = capsys.readouterr().err
    assert ("host node-2: engine-2 NARWHAL_TRANSFER_TRANSPORT is ucx_rdma but no ACTIVE RDMA port was observed"
            in err)
    assert not (root / "config" / "engine-launch.local.json").exists()

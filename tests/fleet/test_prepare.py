"""`deploy-hosts prepare` after a real discovery of simulated hosts (issue: prepare), every file checked.

The checkout is a real git repository; the fleet is the model fleet (the `fleet` fixture, its own instance here:
h1: router + engine-1, h2: engine-2 with PASSWORD auth, h3: engine-3), so destinations and the password are
sentinels whose leak anywhere is detectable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import dagster as dg
import pytest
from fleetsim import SimFleet
from helpers.deploy_hosts import cli
from helpers.files import assert_nowhere, read_json, snapshot, source_env
from helpers.fleet_checkout import DESTINATIONS, ENGINE_HOSTS, HOST_IDS, PASSWORD, ROLES, make_checkout, set_env
from helpers.fleet_readers import (
    fleet_problems,
    launch_record_problems,
    launcher_problems,
    profiling_limits_problems,
    role_file_problems,
)
from helpers.git_repo import TRACKED, git, git_checkout

from narwhal_assets.cli.main import main
from narwhal_assets.definitions import defs as code_location
from narwhal_assets.defs.prepare.assets import (
    OP_NAME,
    bundle_clones_to_revision,
    prepare_deployment,
    prepared_files_hold_no_access,
    prepared_files_private,
)
from narwhal_assets.defs.resources import ManagementCheckout
from narwhal_assets.runtime.runner import operator_instance
from narwhal_assets.ssh.trust import KnownHostsStore

defs = code_location()  # the code location as Dagster loads it

TOOLS = ("launch_engine.py", "fabric_budget.py", "cache_capture_hook.py")
# Each tool's path variable and its SHA-256 companion, as the serving fleet's engine-host checks name them.
TOOL_VARS = {"launch_engine.py": ("NARWHAL_ENGINE_LAUNCHER", "NARWHAL_ENGINE_LAUNCHER_SHA256"),
             "fabric_budget.py": ("NARWHAL_FABRIC_BUDGET_TOOL", "NARWHAL_FABRIC_BUDGET_SHA256"),
             "cache_capture_hook.py": ("NARWHAL_CACHE_CAPTURE_HOOK", "NARWHAL_CACHE_CAPTURE_HOOK_SHA256")}  # fmt: skip
ENGINE_FIELDS = ("ENGINE_IMAGE", "ENGINE_MODEL_NAME", "MODEL_DIR", "RUN_DIR", "MODEL_CONFIG_SHA256", "FABRIC_INTERFACE",
                 "ENGINE_PORT", "ATTEST_PORT", "NIXL_SIDE_CHANNEL_PORT", "UCX_TCP_PORT_RANGE")  # fmt: skip
API_KEY = "engine-key 'with' $(quotes) `and` \"more\"\nsecond line ü"


@pytest.fixture(scope="module")
def discovered_once(
    fleet: SimFleet, ssh_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One discovered git checkout for the module (discovery is the slow part); tests work on copies."""
    root = make_checkout(tmp_path_factory.mktemp("prepare") / "checkout", fleet, ssh_config,
                         NARWHAL_ENGINE_API_KEY="placeholder")  # fmt: skip
    revision = git_checkout(root)
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("NARWHAL_")]:
            patch.delenv(name)
        patch.setenv("DAGSTER_HOME", str(tmp_path_factory.mktemp("dagster")))
        assert main(["--root", str(root), "discover"]) == 0
    (root / "untracked.txt").write_text("workstation only\n")
    (root / "runs" / "ignored.txt").write_text("ignored\n")
    # The revision to deploy is a prepare-only setting: set after discovery, it needs no new discovery.
    set_env(root, NARWHAL_DEPLOYMENT_REVISION=revision)
    return root


@pytest.fixture
def discovered(discovered_once: Path, tmp_path: Path) -> Path:
    """A private copy of the discovered checkout (paths in it are relative to the checkout)."""
    return Path(shutil.copytree(discovered_once, tmp_path / "checkout", symlinks=True))


def role_view(path: Path) -> dict[str, str]:
    """Every NARWHAL_* variable `env -i bash` holds after sourcing a role file (values may span lines)."""
    script = '. "$1" && for v in ${!NARWHAL_@}; do printf "%s\\0%s\\0" "$v" "${!v}"; done'
    done = subprocess.run(["env", "-i", "bash", "-c", script, "bash", str(path)], capture_output=True, check=True)
    fields = done.stdout.decode("utf-8").split("\0")[:-1]
    return dict(zip(fields[::2], fields[1::2], strict=True))


def test_prepare_writes_the_layout_from_the_fleets_truth(
    discovered: Path, fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, out = discovered, tmp_path / "deploy-1"
    revision = git(root, "rev-parse", "HEAD")
    # The engine credential's value changes after discovery: a prepare-only value, no new discovery needed.
    set_env(root, NARWHAL_ENGINE_API_KEY="")
    with (root / ".env").open("a") as env:
        env.write("NARWHAL_ENGINE_API_KEY=" + "'" + API_KEY.replace("'", "'\\''") + "'\n")
    rc, stdout, stderr = cli(root, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, stderr
    assert f"output directory {out}" in stdout and revision in stdout

    files = snapshot(out)
    expected = {"manifest.json", "source.bundle", "sources.json",
                "node-1/.env.router", "node-1/fleet.local.json", "node-1/profiling-limits.json"}  # fmt: skip
    for n, name in ENGINE_HOSTS.items():
        host_id = HOST_IDS[name]
        expected |= {f"{host_id}/.env.engine-{n}", f"{host_id}/engine-launch.engine-{n}.json"}
        expected |= {f"{host_id}/{tool}" for tool in TOOLS}
    assert set(files) == expected

    config = root / "config"
    deployment_env = source_env(config / "deployment.env")
    router = role_view(out / "node-1" / ".env.router")
    assert router == {
        "NARWHAL_DEPLOYMENT_REVISION": revision, "NARWHAL_FLEET": "runs/deployment/fleet.json",
        "NARWHAL_ENGINE_API_KEY": API_KEY,
        **{k: v for k, v in deployment_env.items() if re.fullmatch(r"NARWHAL_NODE_\d_(ATTESTATION_)?URL", k)},
    }  # fmt: skip
    launch = read_json(config / "engine-launch.local.json")["engines"]
    for n, name in ENGINE_HOSTS.items():
        host_id, host = HOST_IDS[name], fleet.host(name)
        env = role_view(out / host_id / f".env.engine-{n}")
        shared = {f"NARWHAL_{f}": env[f"NARWHAL_{f}"] for f in ENGINE_FIELDS}
        assert shared == {
            "NARWHAL_ENGINE_IMAGE": host.image_id, "NARWHAL_ENGINE_MODEL_NAME": "demo-model",
            "NARWHAL_MODEL_DIR": "/srv/models/demo-model", "NARWHAL_RUN_DIR": "/var/tmp/narwhal-run",
            "NARWHAL_MODEL_CONFIG_SHA256": deployment_env[f"NARWHAL_NODE_{n}_MODEL_CONFIG_SHA256"],
            "NARWHAL_FABRIC_INTERFACE": "fab0", "NARWHAL_ENGINE_PORT": "8000", "NARWHAL_ATTEST_PORT": "8001",
            "NARWHAL_NIXL_SIDE_CHANNEL_PORT": "5600", "NARWHAL_UCX_TCP_PORT_RANGE": "50000-50999",
        }  # fmt: skip
        peers = {f"NARWHAL_NODE_{m}_IP": fleet.host(other).fabric_address for m, other in ENGINE_HOSTS.items()}
        tools = {}
        for tool, (variable, digest) in TOOL_VARS.items():
            data = resources.files("narwhal_assets.host.tools").joinpath(tool).read_bytes()
            assert files[f"{host_id}/{tool}"] == data
            tools |= {variable: f"runs/deployment-tools/{tool}", digest: hashlib.sha256(data).hexdigest()}
        assert env == {
            **shared, **peers, **tools, "NARWHAL_DEPLOYMENT_REVISION": revision,
            f"NARWHAL_NODE_{n}_URL": f"http://{host.fabric_address}:8000",
            f"NARWHAL_NODE_{n}_ATTESTATION_URL": f"http://{host.fabric_address}:8001/v1/attestation",
            "NARWHAL_ENGINE_API_KEY": API_KEY,
            "NARWHAL_ENGINE_LAUNCH_CONFIG": f"config/engine-launch.engine-{n}.json",
        }  # fmt: skip
        record = read_json(out / host_id / f"engine-launch.engine-{n}.json")
        assert (record["schema"], record["schema_version"]) == ("narwhal.engine-launch", 1)
        assert record["role"] == f"engine-{n}" and record["iid"] == f"n{n}"
        assert record["serving_role"] == ("prefill" if n == 1 else "decode")
        assert {k: v for k, v in record.items() if k in launch[f"engine-{n}"]} == launch[f"engine-{n}"]
        assert record["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == host.fabric_address
        assert record["runtime"]["expected_packages"] == {"nixl": "0.6.1", "torch": "2.8.0", "vllm": "0.11.0"}
    assert files["node-1/fleet.local.json"] == (config / "fleet.json").read_bytes()
    assert files["node-1/profiling-limits.json"] == (config / "profiling-limits.json").read_bytes()

    # sources.json: every variable of every role file, with its layer
    index = read_json(out / "sources.json")
    sources = index["roles"]
    assert set(sources) == {"router", "engine-1", "engine-2", "engine-3"}
    assert set(sources["engine-2"]["variables"]) | set(index["every_engine"]) == set(
        role_view(out / "node-2" / ".env.engine-2"))
    assert {f"NARWHAL_NODE_{m}_IP" for m in ENGINE_HOSTS} <= set(index["every_engine"])  # once, not per engine
    engine2 = {**index["every_engine"], **sources["engine-2"]["variables"]}
    assert engine2["NARWHAL_ENGINE_IMAGE"]["layer"] == "config/deployment.env"
    assert engine2["NARWHAL_ENGINE_IMAGE"]["variable"] == "NARWHAL_NODE_2_ENGINE_IMAGE"
    assert engine2["NARWHAL_ENGINE_IMAGE"]["observation"].endswith("/node-2.json")
    assert engine2["NARWHAL_MODEL_DIR"]["layer"] == ".env"
    assert engine2["NARWHAL_ENGINE_PORT"]["layer"] == "default"
    assert engine2["NARWHAL_ENGINE_LAUNCHER_SHA256"]["layer"] == "prepare"

    # the serving fleet's readers accept what the real fleet's discovery and this prepare wrote
    fleet_json = read_json(out / "node-1" / "fleet.local.json")
    assert fleet_problems(fleet_json, router) == []
    assert profiling_limits_problems(read_json(out / "node-1" / "profiling-limits.json"),
                                     {e["iid"] for e in fleet_json["engines"]}, launch) == []  # fmt: skip
    access = {"NARWHAL_ROUTER_SSH", "NARWHAL_NODE_2_SSH_PASSWORD", *(f"NARWHAL_NODE_{n}_SSH" for n in ENGINE_HOSTS)}
    for n, name in ENGINE_HOSTS.items():
        role, env = f"engine-{n}", role_view(out / HOST_IDS[name] / f".env.engine-{n}")
        assert launch_record_problems({"schema": "narwhal.engine-launch", "schema_version": 1, "engines": launch},
                                      role, env) == []  # fmt: skip
        assert launcher_problems(read_json(out / HOST_IDS[name] / f"engine-launch.{role}.json"), env) == []
        assert role_file_problems(env, role, fleet_json, list(ENGINE_HOSTS), access) == []
    assert role_file_problems(router, "router", fleet_json, list(ENGINE_HOSTS), access) == []

    # manifest: pins every file, the hosts by variable name, destination digests and trusted keys
    manifest = read_json(out / "manifest.json")
    assert manifest["schema"] == "narwhal.deployment-manifest" and manifest["revision"] == revision
    assert manifest["schema_version"] == 2
    assert re.fullmatch(r"[0-9a-f]{32}", manifest["deployment_id"])
    assert manifest["remote_dir"] == f"Narwhal-deploy/{manifest['deployment_id']}"
    assert manifest["bundle"] == {"path": "source.bundle", "sha256": hashlib.sha256(files["source.bundle"]).hexdigest(),
                                  "size": len(files["source.bundle"]), "keep_if_present": False}  # fmt: skip
    pinned = {"sources.json": manifest["sources"]}
    for host in manifest["hosts"]:
        name = next(n for n, h in HOST_IDS.items() if h == host["id"])
        assert host["roles"] == [r for r, h in ROLES.items() if h == name]
        assert host["ssh_env"] == f"NARWHAL_NODE_{name[1]}_SSH"
        assert host.get("password_env") == ("NARWHAL_NODE_2_SSH_PASSWORD" if name == "h2" else None)
        assert host["destination_sha256"] == hashlib.sha256(DESTINATIONS[name].encode()).hexdigest()
        assert host["host_key_fingerprints"]
        assert set(host["host_key_fingerprints"]) <= set(fleet.host(name).host_key_fingerprints().values())
        pinned |= {f["path"]: f for f in host["files"]}
    assert set(pinned) == set(files) - {"manifest.json", "source.bundle"}
    for path, entry in pinned.items():
        assert entry["sha256"] == hashlib.sha256(files[path]).hexdigest() and entry["size"] == len(files[path])
    install_to = {path: (e.get("install_to"), e["keep_if_present"]) for path, e in pinned.items()}
    assert install_to["node-1/fleet.local.json"] == ("runs/deployment/fleet.json", True)
    assert install_to["node-1/profiling-limits.json"] == ("runs/deployment/profiling-limits.json", False)
    assert install_to["node-2/.env.engine-2"] == ("runs/deployment/.env.engine-2", False)
    assert install_to["node-2/engine-launch.engine-2.json"] == ("config/engine-launch.engine-2.json", False)
    assert install_to["node-3/fabric_budget.py"] == ("runs/deployment-tools/fabric_budget.py", False)
    assert install_to["sources.json"] == (None, False)

    # the bundle: exactly the committed tree, at the revision
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "-b", "deployment", str(out / "source.bundle"), str(clone)], check=True)
    assert git(clone, "rev-parse", "HEAD") == revision
    assert set(git(clone, "ls-files").splitlines()) == set(TRACKED)
    assert git(clone, "status", "--porcelain", "--ignored") == ""
    assert not (clone / "untracked.txt").exists() and not (clone / ".env").exists()

    # private modes, no leftovers, no secret anywhere (files, Dagster storage, output)
    for path in [out, *out.rglob("*")]:
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert_nowhere([PASSWORD, *DESTINATIONS.values()], [out, root / "runs", Path(os.environ["DAGSTER_HOME"])])
    assert not any(s in stdout + stderr for s in [PASSWORD, *DESTINATIONS.values(), API_KEY])
    assert "asset checks: 3 passed" in stdout


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = read_json(path)
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def commit_dotenv(root: Path) -> str:
    """A later commit that adds a file named `.env` (a secret committed by mistake); returns its id."""
    (root / "app" / ".env").write_text("TOKEN=committed-by-mistake\n")
    git(root, "add", "-f", "app/.env")
    git(root, "commit", "-q", "-m", "oops")
    return git(root, "rev-parse", "HEAD")


def blank_node_override(root: Path) -> None:
    path = root / "config" / "deployment.env"
    path.write_text(re.sub(r"(?m)^export NARWHAL_NODE_2_ENGINE_IMAGE=.*$", "export NARWHAL_NODE_2_ENGINE_IMAGE=''",
                           path.read_text()))  # fmt: skip


def without_input_digests(root: Path) -> None:
    """The discovery run as discovery wrote it before `inputs` existed, then a setting changed."""
    for manifest in (root / "runs" / "discovery").glob("*/manifest.json"):
        edit_json(manifest, lambda m: m.pop("inputs"))
    set_env(root, NARWHAL_MAX_NUM_SEQS="4")


# A new destination for h3 that the known-hosts store has no key for (a host moved to another address).
MOVED = "mgmt-sentinel-q7zk-moved"
REDISCOVER = r"run `deploy-hosts discover` before preparing"
REFUSALS = {
    "unset": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION=""),
              r"NARWHAL_DEPLOYMENT_REVISION is unset; set NARWHAL_DEPLOYMENT_REVISION=\$\(git rev-parse HEAD\)"),
    "short": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION=git(root, "rev-parse", "--short", "HEAD")),
              r"NARWHAL_DEPLOYMENT_REVISION must be a full 40- or 64-hex commit id, not a branch, tag or short id"),
    "branch": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION="main"),
               r"must be a full 40- or 64-hex commit id.*git rev-parse HEAD"),
    "unknown": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION="0123456789" * 4),
                r"NARWHAL_DEPLOYMENT_REVISION: (0123456789){4} is not a commit of the management checkout"),
    "tree-object": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION=git(root, "rev-parse", "HEAD^{tree}")),
                    r"is not a commit of the management checkout"),
    "dotenv": (lambda root: set_env(root, NARWHAL_DEPLOYMENT_REVISION=commit_dotenv(root)),
               r"the tree of [0-9a-f]{40} contains private files \(app/\.env\): secrets committed by mistake"),
    "ssh-reference": (lambda root: edit_json(root / "config" / "fleet.json",
                                             lambda f: f["engines"][1].update(url="${NARWHAL_NODE_2_SSH}")),
                      r"role export node-1/\.env\.router: NARWHAL_NODE_2_SSH \(fleet engines\[1\]\.url\) names SSH "
                      r"access"),
    "empty-override": (blank_node_override,
                       r"role export node-2/\.env\.engine-2: engine-2: NARWHAL_NODE_2_ENGINE_IMAGE is set but empty; "
                       r"NARWHAL_ENGINE_IMAGE is required"),
    "changed-inputs": (lambda root: set_env(root, NARWHAL_MAX_NUM_SEQS="4"),
                       rf"changed since discovery run \S+: NARWHAL_MAX_NUM_SEQS \(set since\); {REDISCOVER}$"),
    "changed-model": (lambda root: set_env(root, NARWHAL_ENGINE_MODEL_NAME="model-sentinel-v2"),
                      rf"changed since discovery run \S+: NARWHAL_ENGINE_MODEL_NAME; {REDISCOVER}$"),
    "changed-destination": (lambda root: set_env(root, NARWHAL_NODE_3_SSH=MOVED, NARWHAL_ENGINE_API_KEY=""),
                            rf"changed since discovery run \S+: NARWHAL_NODE_3_SSH, the engine credential's variable; "
                            rf"{REDISCOVER}$"),
    "pre-digests-discovery": (without_input_digests,
                              r"the inventory, destinations or settings differ from those discovery run .* used; "
                              rf"{REDISCOVER}$"),
    "no-discovery": (lambda root: [p.unlink() for p in (root / "runs" / "discovery").glob("*/manifest.json")],
                     r"no discovery has published a config set in .*; run `deploy-hosts discover`"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSALS))
@pytest.mark.parametrize("with_out", [True, False], ids=["out", "default-out"])
def test_bad_input_exits_2_with_one_line_and_leaves_nothing(
    discovered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, with_out: bool
) -> None:
    change, message = REFUSALS[case]
    change(discovered)
    out = tmp_path / "deploy"
    before = snapshot(discovered / "runs")
    dagster_home = Path(os.environ["DAGSTER_HOME"])
    dagster_before = snapshot(dagster_home)
    rc, stdout, stderr = cli(discovered, "prepare", *(["--out", str(out)] if with_out else []), capsys=capsys)
    assert rc == 2, stdout + stderr
    assert snapshot(dagster_home) == dagster_before, "no Dagster run"
    assert "sentinel" not in (stdout + stderr).lower()
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("deploy-hosts prepare: error: "), stderr
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists()
    after = snapshot(discovered / "runs")
    assert {k: v for k, v in after.items() if not k.startswith("dagster/")} == {
        k: v for k, v in before.items() if not k.startswith("dagster/")
    }
    assert not (discovered / "runs" / "deployment-env").exists()
    assert_nowhere([PASSWORD, *DESTINATIONS.values()], [Path(os.environ["DAGSTER_HOME"])])
    assert not any(s in stdout + stderr for s in [PASSWORD, *DESTINATIONS.values()])


def test_after_a_destination_change_install_and_prepare_each_say_the_whole_way(
    discovered: Path, fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`install` names the variable and every step back (not a key change: the store has no key for the new
    endpoint); `prepare` then names it too and asks for discovery first. Neither writes nor contacts anything."""
    out = tmp_path / "deploy"
    rc, _, stderr = cli(discovered, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, stderr
    set_env(discovered, NARWHAL_NODE_3_SSH=MOVED)
    dagster_home = Path(os.environ["DAGSTER_HOME"])
    before = snapshot(discovered), snapshot(out), snapshot(dagster_home)
    rc, stdout, stderr = cli(discovered, "install", "--run", str(out), capsys=capsys)
    assert rc == 2, stdout + stderr
    assert stderr == (f"deploy-hosts install: error: {out}/manifest.json: hosts[node-3].destination_sha256: the "
                      "destination in NARWHAL_NODE_3_SSH changed since this run was prepared; run `deploy-hosts "
                      "discover`, then `deploy-hosts prepare`, then install the new run\n")  # fmt: skip
    rc, stdout, stderr = cli(discovered, "prepare", capsys=capsys)
    assert rc == 2, stdout + stderr
    assert re.fullmatch(rf"deploy-hosts prepare: error: changed since discovery run \S+: NARWHAL_NODE_3_SSH; "
                        rf"{REDISCOVER}\n", stderr), stderr  # fmt: skip
    assert (snapshot(discovered), snapshot(out), snapshot(dagster_home)) == before
    assert not any((fleet.host(name).home / "Narwhal-deploy").exists() for name in HOST_IDS)
    assert MOVED not in stdout + stderr


def test_a_changed_host_key_is_named_with_prepare_as_the_fix(
    discovered: Path, fleet: SimFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same destination, another key trusted for it since prepare: the key change is reported, and a new
    `prepare` (no discovery) is the fix."""
    out = tmp_path / "deploy"
    rc, _, stderr = cli(discovered, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, stderr
    store = KnownHostsStore(discovered / "config" / "ssh.known_hosts")
    h1, h3 = fleet.host("h1"), fleet.host("h3")
    other = store.keys_for(h1.address, h1.port)[0]
    store.replace("node-3", h3.address, h3.port, other, other.fingerprint)  # what `deploy-hosts trust` does
    rc, stdout, stderr = cli(discovered, "install", "--run", str(out), capsys=capsys)
    assert rc == 2, stdout + stderr
    assert stderr == (f"deploy-hosts install: error: {out}/manifest.json: hosts[node-3].host_key_fingerprints: "
                      "differ from the keys pinned in the known-hosts store now; prepare a new run (`deploy-hosts "
                      "prepare`)\n")  # fmt: skip
    rc, _, stderr = cli(discovered, "prepare", "--out", str(tmp_path / "again"), capsys=capsys)
    assert rc == 0, stderr


def test_an_existing_output_directory_is_refused_and_kept(
    discovered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "used"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier deployment\n")
    rc, _, stderr = cli(discovered, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 2
    assert stderr == (f"deploy-hosts prepare: error: --out {out}: exists and is not an empty directory; use a new "
                      "output directory for each deployment\n")  # fmt: skip
    assert snapshot(out) == {"earlier.txt": b"an earlier deployment\n"}
    (out / "earlier.txt").unlink()
    rc, _, stderr = cli(discovered, "prepare", "--out", str(out), capsys=capsys)
    assert rc == 0, stderr
    assert out.stat().st_mode & 0o777 == 0o700 and (out / "manifest.json").is_file()


def comparable(out: Path) -> tuple[dict[str, bytes], dict]:
    """Every prepared file but the bundle and manifest, and the manifest without what differs per run (the ids,
    the bundle, and `sources.json`'s digest: its value digests are keyed by a salt drawn per run)."""
    per_file = ("manifest.json", "source.bundle", "sources.json")
    files = {k: v for k, v in snapshot(out).items() if k not in per_file}
    salted = ("salt", "value_hmac")
    sources = json.loads((out / "sources.json").read_text(),
                         object_hook=lambda d: {k: v for k, v in d.items() if k not in salted})  # fmt: skip
    files["sources.json"] = json.dumps(sources, sort_keys=True).encode()
    manifest = read_json(out / "manifest.json")
    per_run = ("deployment_id", "remote_dir", "created_at", "bundle", "sources")
    return files, {k: v for k, v in manifest.items() if k not in per_run}


def dagster_materialize(root: Path, cwd: Path, selection: str) -> subprocess.CompletedProcess[str]:
    """`dagster asset materialize` of `selection` from the code location of the checkout `root`, run in `cwd`."""
    dagster = Path(sys.executable).with_name("dagster")
    return subprocess.run(
        [str(dagster), "asset", "materialize", "-m", "narwhal_assets.definitions", "--select", selection],
        cwd=cwd, env={**os.environ, "NARWHAL_ROOT": str(root)}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


def test_dagster_cli_materialize_produces_the_same_files(
    discovered: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, stderr = cli(discovered, "prepare", "--out", str(tmp_path / "by-command"), capsys=capsys)
    assert rc == 0, stderr
    elsewhere = tmp_path / "elsewhere"  # no .env here: Dagster would copy one into its environment
    elsewhere.mkdir()
    done = dagster_materialize(discovered, elsewhere, "group:prepare")
    assert done.returncode == 0, done.stderr[-4000:]
    [default_out] = (discovered / "runs" / "deployment-env").iterdir()
    assert comparable(default_out) == comparable(tmp_path / "by-command")
    assert default_out.stat().st_mode & 0o777 == 0o700
    assert not any(s in done.stdout + done.stderr for s in [PASSWORD, *DESTINATIONS.values()])


def test_a_selection_of_every_asset_installs_no_host(discovered: Path, tmp_path: Path) -> None:
    """A selection that matches nothing (here the prepare group's earlier name) makes Dagster's CLI run every
    asset; host_installation then fails at once, before it reads the prepared run, saying how to name the hosts."""
    Path(os.environ["DAGSTER_HOME"]).mkdir(exist_ok=True)
    done = dagster_materialize(discovered, tmp_path, "group:deployment")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-4000:]
    assert "host_installation is partitioned by host: name the hosts (`--partition node-1`" in output
    assert "Cannot access partition_key" not in output
    assert not any(s in output for s in [PASSWORD, *DESTINATIONS.values()])


def test_prepare_job_runs_the_three_assets_and_their_checks(
    discovered: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the UI launches: `prepare_job` with the same run config as the command."""
    monkeypatch.setenv("NARWHAL_ROOT", str(discovered))
    out = tmp_path / "from-ui"
    with operator_instance(discovered) as instance:
        result = defs.resolve_job_def("prepare_job").execute_in_process(
            run_config={"ops": {OP_NAME: {"config": {"out": str(out)}}}}, instance=instance
        )
        assert result.success and result.dagster_run.job_name == "prepare_job"
        keys = {m.asset_key.to_user_string() for m in result.asset_materializations_for_node(OP_NAME)}
        assert keys == {"source_bundle", "role_environments", "deployment_manifest"}
        evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
        assert evaluations == {"bundle_clones_to_revision": True, "prepared_files_private": True,
                               "prepared_files_hold_no_access": True}  # fmt: skip
        metadata = instance.get_latest_materialization_event(dg.AssetKey("role_environments")).asset_materialization
        assert metadata.metadata["out"].value == str(out)
        assert metadata.metadata["files_per_host"].value == {"node-1": 8, "node-2": 5, "node-3": 5}

        # the checks can fail, naming the file: a loose mode, a leaked password, a host-key line, a bad bundle
        (out / "node-2" / ".env.engine-2").chmod(0o644)
        with (out / "node-3" / ".env.engine-3").open("a") as role_file:
            role_file.write(f"# {PASSWORD}\n")
        known_line = (discovered / "config" / "ssh.known_hosts").read_text().splitlines()[0]
        (out / "node-1" / "fleet.local.json").write_text(known_line + "\n")
        (out / "source.bundle").write_bytes(b"not a bundle")
        checks = [bundle_clones_to_revision, prepared_files_private, prepared_files_hold_no_access]
        rerun = dg.materialize([prepare_deployment, *checks], selection=dg.AssetSelection.checks(*checks),
                               resources={"checkout": ManagementCheckout(root=str(discovered))},
                               instance=instance)  # fmt: skip
        found = {e.check_name: e for e in rerun.get_asset_check_evaluations()}
        private, leaks, bundle = (found[c.check_key.name] for c in checks[1:] + checks[:1])
        assert not private.passed
        assert private.description == f"{out / 'node-2' / '.env.engine-2'}: mode 0644, expected 0600"
        assert not leaks.passed
        assert leaks.description.splitlines() == [
            "node-1/fleet.local.json: contains a host key from the trust store",
            "node-3/.env.engine-3: contains the password in NARWHAL_NODE_2_SSH_PASSWORD",
        ]
        assert not bundle.passed and "source.bundle: git clone failed" in bundle.description
        assert PASSWORD not in leaks.description + private.description + bundle.description

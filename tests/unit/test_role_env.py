"""Role environments: exact export lists, sources, the credential guard, bash round trips; and the
checks `prepare` runs before writing (revision, discovery-inputs digest, private files in the tree)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.envfile import HYPO, VALUES, bash_view, needs_bash
from hypothesis import given
from hypothesis import strategies as st

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.access_secrets import Needle
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.inputs.settings import Layer, Settings
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.fleet import EngineCredential, Fleet, FleetEngine, Hardware
from narwhal_assets.core.launch.models import EngineLaunchConfig
from narwhal_assets.core.prepared_run.layout import PublishedSet, host_files
from narwhal_assets.core.prepared_run.prepare_inputs import (
    changed_inputs,
    check_revision,
    discovery_inputs_digest,
    input_digests,
    private_tree_paths,
)
from narwhal_assets.core.prepared_run.role_env import (
    ExportInputs,
    RoleEnvironment,
    build_role_environments,
    role_sources,
    value_hmac,
)

DEST_1 = "ops@SENTINEL-dest-one.example"
DEST_2 = "SENTINEL-dest-two"
PASSWORD = "SENTINEL-pw-7f3a"
REVISION = "a" * 40
TOOL_SHA = {"launch_engine.py": "1" * 64, "fabric_budget.py": "2" * 64, "cache_capture_hook.py": "3" * 64}
INVENTORY = Inventory(hosts=[
    HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1"]),
    HostEntry(id="node-2", ssh_env="NARWHAL_NODE_2_SSH", password_env="NARWHAL_NODE_2_SSH_PASSWORD",
              roles=["engine-2"]),
])  # fmt: skip
DISCOVERED = {
    **{f"NARWHAL_NODE_{n}_IP": f"10.0.0.{n}" for n in (1, 2)},
    **{f"NARWHAL_NODE_{n}_URL": f"http://10.0.0.{n}:8000" for n in (1, 2)},
    **{f"NARWHAL_NODE_{n}_ATTESTATION_URL": f"http://10.0.0.{n}:8001/v1/attestation" for n in (1, 2)},
    **{f"NARWHAL_NODE_{n}_ENGINE_IMAGE": f"sha256:{n}" + "0" * 63 for n in (1, 2)},
    **{f"NARWHAL_NODE_{n}_MODEL_CONFIG_SHA256": "c" * 64 for n in (1, 2)},
}
DOTENV = {
    "NARWHAL_NODE_1_SSH": DEST_1, "NARWHAL_NODE_2_SSH": DEST_2, "NARWHAL_NODE_2_SSH_PASSWORD": PASSWORD,
    "NARWHAL_ENGINE_IMAGE": "registry/engine:tag", "NARWHAL_ENGINE_MODEL_NAME": "demo",
    "NARWHAL_MODEL_DIR": "/srv/models/demo", "NARWHAL_RUN_DIR": "/var/tmp/run", "NARWHAL_FABRIC_INTERFACE": "fab0",
    "NARWHAL_DEPLOYMENT_REVISION": REVISION, "NARWHAL_ENGINE_API_KEY": "key with 'quotes' and $(x)",
}  # fmt: skip
SALT = "5a" * 32
ROUTER_REFS = {"url": "${NARWHAL_NODE_{n}_URL}", "attestation_url": "${NARWHAL_NODE_{n}_ATTESTATION_URL}"}


def make_fleet(credential: str | None = "NARWHAL_ENGINE_API_KEY", **engine_2: str) -> Fleet:
    engines = [
        FleetEngine(iid=f"n{n}", url=f"${{NARWHAL_NODE_{n}_URL}}",
                    attestation_url=f"${{NARWHAL_NODE_{n}_ATTESTATION_URL}}", role="prefill" if n == 1 else "decode")
        for n in (1, 2)
    ]  # fmt: skip
    engines[1] = engines[1].model_copy(update=engine_2)
    hardware = Hardware(accelerator="H200", accelerators_per_engine=1, tensor_parallel=1)
    credentials = EngineCredential(engine_api_key_env=credential) if credential else None
    return Fleet(model="demo", hardware=hardware, engines=engines, engine=credentials)


def make_settings(dotenv: dict[str, str] | None = None, discovered: dict[str, str] | None = None,
                  process: dict[str, str] | None = None) -> Settings:  # fmt: skip
    return Settings(Path("/checkout"), ((Layer.DEFAULT, {}), (Layer.DISCOVERED, discovered or DISCOVERED),
                                        (Layer.DOTENV, dotenv or DOTENV), (Layer.PROCESS, process or {})))  # fmt: skip


def inputs_of(settings: Settings | None = None, fleet: Fleet | None = None) -> ExportInputs:
    return ExportInputs(settings=settings or make_settings(), inventory=INVENTORY, fleet=fleet or make_fleet(),
                        revision=REVISION, tool_sha256=TOOL_SHA, observations={1: "run/n1.json", 2: "run/n2.json"},
                        salt=SALT)  # fmt: skip


def build(settings: Settings | None = None, fleet: Fleet | None = None) -> dict[str, RoleEnvironment]:
    return {env.role.name: env for env in build_role_environments(inputs_of(settings, fleet))}


def refusal(settings: Settings | None = None, fleet: Fleet | None = None) -> list[str]:
    with pytest.raises(InputError) as info:
        build(settings, fleet)
    assert not any(s in str(info.value) for s in (DEST_1, DEST_2, PASSWORD)), "an error message holds a secret"
    return info.value.problems


# --- what each role exports -----------------------------------------------------------------------------


def test_router_exports_exactly_the_spec_list() -> None:
    optional = {"NARWHAL_ROUTER_URL": "http://router:9000", "NARWHAL_PROMETHEUS_LISTEN_ADDRESS": ""}
    settings = make_settings({**DOTENV, **optional})
    router = build(settings)["router"]
    assert router.values() == {
        "NARWHAL_DEPLOYMENT_REVISION": REVISION, "NARWHAL_FLEET": "runs/deployment/fleet.json",
        **{k: v for k, v in DISCOVERED.items() if k.endswith("URL")},
        "NARWHAL_ENGINE_API_KEY": DOTENV["NARWHAL_ENGINE_API_KEY"],
        "NARWHAL_ROUTER_URL": "http://router:9000", "NARWHAL_PROMETHEUS_LISTEN_ADDRESS": "",
    }  # fmt: skip
    assert router.path == "node-1/.env.router"
    sources = {name: (e.source.layer.value, e.source.reason) for name, e in router.exports.items()}
    assert sources["NARWHAL_NODE_2_ATTESTATION_URL"] == ("config/deployment.env", "fleet engines[1].attestation_url")
    assert sources["NARWHAL_FLEET"][0] == "prepare"
    assert sources["NARWHAL_ROUTER_URL"] == (".env", "optional router setting")
    assert router.exports["NARWHAL_NODE_1_URL"].source.observation == "run/n1.json"


def test_router_without_credential_or_optional_settings() -> None:
    assert set(build(fleet=make_fleet(credential=None))["router"].values()) == {
        "NARWHAL_DEPLOYMENT_REVISION", "NARWHAL_FLEET", *(k for k in DISCOVERED if k.endswith("URL"))}  # fmt: skip


def test_engine_exports_shared_fields_overrides_peers_credential_and_tools() -> None:
    dotenv = {**DOTENV, "NARWHAL_NODE_2_RUN_DIR": "/data/run-2", "NARWHAL_ENGINE_TOKEN": "tok"}
    settings = make_settings(dotenv, process={"NARWHAL_NODE_2_ENGINE_PORT": "9000"})
    engine = build(settings, make_fleet(credential="NARWHAL_ENGINE_TOKEN"))["engine-2"]
    assert engine.values() == {
        "NARWHAL_DEPLOYMENT_REVISION": REVISION,
        "NARWHAL_ENGINE_IMAGE": DISCOVERED["NARWHAL_NODE_2_ENGINE_IMAGE"], "NARWHAL_ENGINE_MODEL_NAME": "demo",
        "NARWHAL_MODEL_DIR": "/srv/models/demo", "NARWHAL_RUN_DIR": "/data/run-2",
        "NARWHAL_MODEL_CONFIG_SHA256": "c" * 64,
        "NARWHAL_FABRIC_INTERFACE": "fab0", "NARWHAL_ENGINE_PORT": "9000", "NARWHAL_ATTEST_PORT": "8001",
        "NARWHAL_NIXL_SIDE_CHANNEL_PORT": "5600", "NARWHAL_UCX_TCP_PORT_RANGE": "50000-50999",
        "NARWHAL_NODE_1_IP": "10.0.0.1", "NARWHAL_NODE_2_IP": "10.0.0.2",
        "NARWHAL_NODE_2_URL": "http://10.0.0.2:8000", "NARWHAL_NODE_2_ATTESTATION_URL": "http://10.0.0.2:8001/v1/attestation",
        "NARWHAL_ENGINE_TOKEN": "tok", "NARWHAL_ENGINE_API_KEY": "tok",
        "NARWHAL_ENGINE_LAUNCH_CONFIG": "config/engine-launch.engine-2.json",
        "NARWHAL_ENGINE_LAUNCHER": "runs/deployment-tools/launch_engine.py", "NARWHAL_ENGINE_LAUNCHER_SHA256": "1" * 64,
        "NARWHAL_FABRIC_BUDGET_TOOL": "runs/deployment-tools/fabric_budget.py",
        "NARWHAL_FABRIC_BUDGET_SHA256": "2" * 64,
        "NARWHAL_CACHE_CAPTURE_HOOK": "runs/deployment-tools/cache_capture_hook.py",
        "NARWHAL_CACHE_CAPTURE_HOOK_SHA256": "3" * 64,
    }  # fmt: skip
    index = role_sources(inputs_of(settings), [engine])
    sources = {**index.every_engine, **index.roles["engine-2"].variables}
    assert (sources["NARWHAL_RUN_DIR"].layer, sources["NARWHAL_RUN_DIR"].variable) == (".env", "NARWHAL_NODE_2_RUN_DIR")
    assert (sources["NARWHAL_ENGINE_PORT"].layer, sources["NARWHAL_ENGINE_PORT"].variable) == (
        "process environment", "NARWHAL_NODE_2_ENGINE_PORT")  # fmt: skip
    assert (sources["NARWHAL_ATTEST_PORT"].layer, sources["NARWHAL_ATTEST_PORT"].variable) == ("default", None)
    assert sources["NARWHAL_ENGINE_IMAGE"].observation == "run/n2.json"
    assert sources["NARWHAL_ENGINE_API_KEY"].reason == "fleet engine.engine_api_key_env (as NARWHAL_ENGINE_API_KEY)"


def test_sources_list_what_every_engine_file_shares_once() -> None:
    """Every engine file lists every node's fabric address (the role-file contract); sources.json need not."""
    environments = list(build().values())
    index = role_sources(inputs_of(), environments)
    assert {"NARWHAL_NODE_1_IP", "NARWHAL_NODE_2_IP", "NARWHAL_DEPLOYMENT_REVISION",
            "NARWHAL_FABRIC_BUDGET_SHA256"} <= set(index.every_engine)  # fmt: skip
    for role in ("engine-1", "engine-2"):
        assert not set(index.roles[role].variables) & set(index.every_engine)
        assert set(index.roles[role].variables) | set(index.every_engine) == set(build()[role].values())
    assert "NARWHAL_NODE_1_IP" not in index.roles["router"].variables
    text = render_json(index)
    assert text.count('"NARWHAL_NODE_2_IP": {') == 1 and DOTENV["NARWHAL_ENGINE_API_KEY"] not in text
    ip = index.every_engine["NARWHAL_NODE_2_IP"]
    assert ip.value_hmac == value_hmac(SALT, "NARWHAL_NODE_2_IP", "10.0.0.2") != value_hmac("a5" * 32,
                                                                                            "NARWHAL_NODE_2_IP",
                                                                                            "10.0.0.2")


def test_role_files_are_sorted_export_lines() -> None:
    text = build()["engine-1"].render()
    lines = text.splitlines()
    assert all(line.startswith("export NARWHAL_") for line in lines if "=" in line.split("'")[0])
    names = [line.split("=", 1)[0].removeprefix("export ") for line in lines if line.startswith("export ")]
    assert names == sorted(names) and len(names) == len(build()["engine-1"].exports)


# --- the credential guard: errors naming the variable and what pulled it in, nothing filtered ---------------


@pytest.mark.parametrize(
    ("settings", "fleet", "expected"),
    [
        (None, make_fleet(url="${NARWHAL_NODE_2_SSH}"),
         ["role export node-1/.env.router: NARWHAL_NODE_2_SSH (fleet engines[1].url) names SSH access; management "
          "access never leaves the workstation (remove the reference)"]),
        (None, make_fleet(credential="NARWHAL_NODE_2_SSH_PASSWORD"),
         [f"role export {f}: NARWHAL_NODE_2_SSH_PASSWORD (fleet engine.engine_api_key_env) names SSH access; "
          "management access never leaves the workstation (remove the reference)"
          for f in ("node-1/.env.router", "node-1/.env.engine-1", "node-2/.env.engine-2")]),
        (make_settings({**DOTENV, "NARWHAL_ROUTER_URL": DEST_2}), None,
         ["role export node-1/.env.router: NARWHAL_ROUTER_URL (optional router setting): its value contains the "
          "management destination in NARWHAL_NODE_2_SSH"]),
        (make_settings({**DOTENV, "NARWHAL_ENGINE_API_KEY": f"x {PASSWORD} y"}), make_fleet(), None),
        (make_settings({**DOTENV, "NARWHAL_NODE_2_MODEL_DIR": ""}), None,
         ["role export node-2/.env.engine-2: engine-2: NARWHAL_NODE_2_MODEL_DIR is set but empty; NARWHAL_MODEL_DIR "
          "is required (remove the override to use NARWHAL_MODEL_DIR, or give it a value)"]),
        (make_settings(discovered={k: v for k, v in DISCOVERED.items() if k != "NARWHAL_NODE_2_IP"}), None,
         [f"role export {f}: NARWHAL_NODE_2_IP (fabric peer address) is unset or empty; set it in .env or run "
          "`deploy-hosts discover`" for f in ("node-1/.env.engine-1", "node-2/.env.engine-2")]),
        (None, make_fleet(credential="lower_case"),
         [f"role export {f}: lower_case (fleet engine.engine_api_key_env): variable names must match [A-Z][A-Z0-9_]*"
          for f in ("node-1/.env.router", "node-1/.env.engine-1", "node-2/.env.engine-2")]),
    ],
    ids=["ssh-reference", "ssh-credential", "destination-value", "password-in-key", "empty-override",
         "missing-peer", "bad-name"],
)  # fmt: skip
def test_credential_guard_names_variable_and_reason(
    settings: Settings | None, fleet: Fleet | None, expected: list[str] | None
) -> None:
    problems = refusal(settings, fleet)
    if expected is not None:
        assert problems == expected
    else:
        assert problems and all("its value contains the password in NARWHAL_NODE_2_SSH_PASSWORD" in p for p in problems)


def test_an_inventory_access_variable_is_refused_whatever_its_name() -> None:
    node_2 = INVENTORY.hosts[1].model_copy(update={"password_env": "OPS_PASS"})
    inventory = Inventory(hosts=[INVENTORY.hosts[0], node_2])
    inputs = ExportInputs(settings=make_settings({**DOTENV, "OPS_PASS": "x"}), inventory=inventory,
                          fleet=make_fleet(credential="OPS_PASS"), revision=REVISION, tool_sha256=TOOL_SHA)  # fmt: skip
    with pytest.raises(InputError) as info:
        build_role_environments(inputs)
    assert info.value.problems[0] == ("role export node-1/.env.router: OPS_PASS (fleet engine.engine_api_key_env) is "
                                      "the inventory password_env of host node-2; management access never leaves the "
                                      "workstation (remove the reference)")  # fmt: skip


# --- bash reads back exactly the original bytes (hypothesis) --------------------------------------------

@needs_bash
@HYPO
@given(
    values=st.lists(
        st.tuples(VALUES.filter(bool), VALUES.filter(bool), VALUES.filter(bool), VALUES), min_size=1, max_size=6
    )
)
def test_role_files_round_trip_through_bash(tmp_path: Path, values: list[tuple[str, str, str, str]]) -> None:
    texts, expected = [], []
    names = ("NARWHAL_MODEL_DIR", "NARWHAL_ENGINE_MODEL_NAME", "NARWHAL_ENGINE_API_KEY", "NARWHAL_ROUTER_URL")
    for model_dir, model_name, key, router_url in values:
        given_values = dict(zip(names, (model_dir, model_name, key, router_url), strict=True))
        settings = make_settings({k: v for k, v in DOTENV.items() if k not in names} | given_values)
        environments = build(settings)
        for role in ("router", "engine-1"):
            texts.append(environments[role].render())
            expected.append({n: v for n, v in environments[role].values().items() if n in names})
    assert bash_view(tmp_path, texts, names) == expected


# --- before anything is written: revision, discovery inputs, private files in the tree -------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "NARWHAL_DEPLOYMENT_REVISION is unset; set NARWHAL_DEPLOYMENT_REVISION=$(git rev-parse HEAD) (the "
               "full commit id to deploy)"),
        ("", "NARWHAL_DEPLOYMENT_REVISION is unset"),
        ("abc1234", "must be a full 40- or 64-hex commit id, not a branch, tag or short id"),
        ("main", "must be a full 40- or 64-hex commit id"),
        ("g" * 40, "must be a full 40- or 64-hex commit id"),
        ("a" * 41, "must be a full 40- or 64-hex commit id"),
    ],
)  # fmt: skip
def test_revision_must_be_a_full_commit_id(value: str | None, message: str) -> None:
    with pytest.raises(InputError) as info:
        check_revision(value)
    assert message in str(info.value) and len(info.value.problems) == 1


def test_full_revisions_are_accepted_lower_case() -> None:
    assert check_revision("A" * 40) == "a" * 40
    assert check_revision("0123456789abcdef" * 4) == "0123456789abcdef" * 4


def digest(dotenv: dict[str, str] | None = None, inventory: Inventory = INVENTORY, **layers: dict[str, str]) -> str:
    return discovery_inputs_digest(make_settings(dotenv or DOTENV, **layers), inventory)


@pytest.mark.parametrize(
    "change",
    [
        {"NARWHAL_NODE_2_SSH": "another-host"},
        {"NARWHAL_MAX_NUM_SEQS": "4"},
        {"NARWHAL_NODE_2_GPU_IDS": "0,1"},
        {"NARWHAL_NODE_1_ROLE": "decode"},
        {"NARWHAL_ENGINE_API_KEY": ""},
        {"NARWHAL_FLEET": "config/other-fleet.json"},
        {"NARWHAL_SSH_CONFIG": "/etc/other-ssh-config"},
        {"NARWHAL_NODE_3_SSH": "third-host"},
        {"NARWHAL_NODE_1_URL": "http://override:8000"},  # discovery checks these and records them
        {"NARWHAL_NODE_2_IP": "10.0.0.9"},
        {"NARWHAL_NODE_2_ATTESTATION_URL": "http://override:8001/v1/attestation"},
    ],
)
def test_discovery_inputs_digest_changes_with_each_discovery_input(change: dict[str, str]) -> None:
    assert digest({**DOTENV, **change}) != digest()


@pytest.mark.parametrize(
    "change",
    [
        {"NARWHAL_DEPLOYMENT_REVISION": "b" * 40},
        {"NARWHAL_NODE_2_SSH_PASSWORD": "rotated"},
        {"NARWHAL_ENGINE_API_KEY": "another key"},
        {"NARWHAL_ROUTER_URL": "http://router:1"},
        {"NARWHAL_DEPLOYMENT_ENV_DIR": "elsewhere"},
        {"NARWHAL_ROOT": "/somewhere"},
        {"PATH": "/usr/bin"},
    ],
)
def test_prepare_only_settings_are_not_discovery_inputs(change: dict[str, str]) -> None:
    assert digest({**DOTENV, **change}) == digest()
    assert digest(process=change) == digest()


def test_digest_covers_the_inventory_but_not_the_discovered_layer() -> None:
    moved = Inventory(hosts=[INVENTORY.hosts[0], INVENTORY.hosts[1].model_copy(update={"password_env": None})])
    assert digest(inventory=moved) != digest()
    assert digest(discovered={"NARWHAL_NODE_1_IP": "10.9.9.9"}) == digest()
    # The same value from .env or from the process environment is the same input.
    process_only = {k: v for k, v in DOTENV.items() if k != "NARWHAL_MODEL_DIR"}
    assert digest(process_only, process={"NARWHAL_MODEL_DIR": DOTENV["NARWHAL_MODEL_DIR"]}) == digest()



@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"NARWHAL_NODE_2_SSH": "another-host"}, ["NARWHAL_NODE_2_SSH"]),
        ({"NARWHAL_ENGINE_MODEL_NAME": "other"}, ["NARWHAL_ENGINE_MODEL_NAME"]),
        ({"NARWHAL_MAX_NUM_SEQS": "4", "NARWHAL_NODE_3_SSH": "third"}, ["NARWHAL_MAX_NUM_SEQS (set since)",
                                                                       "NARWHAL_NODE_3_SSH (set since)"]),
        ({"NARWHAL_FABRIC_INTERFACE": None}, ["NARWHAL_FABRIC_INTERFACE (unset since)"]),
        ({"NARWHAL_ENGINE_API_KEY": ""}, ["the engine credential's variable"]),
        ({"NARWHAL_NODE_2_SSH_PASSWORD": "rotated", "NARWHAL_ENGINE_API_KEY": "other key"}, []),
    ],
)  # fmt: skip
def test_changed_inputs_are_named(change: dict[str, str | None], named: list[str]) -> None:
    """`None` removes the variable."""
    recorded = input_digests(make_settings(), INVENTORY, SALT)
    dotenv = {k: v for k, v in {**DOTENV, **change}.items() if v is not None}
    assert changed_inputs(recorded, make_settings(dotenv), INVENTORY) == named


def test_a_changed_inventory_is_named_by_its_file() -> None:
    recorded = input_digests(make_settings(), INVENTORY, SALT)
    moved = Inventory(hosts=[INVENTORY.hosts[0], INVENTORY.hosts[1].model_copy(update={"password_env": None})])
    assert changed_inputs(recorded, make_settings(), moved) == ["the inventory (/checkout/config/hosts.local.json)"]


def test_input_digests_hold_names_and_salted_digests_only() -> None:
    same = {**DOTENV, "NARWHAL_NODE_1_SSH": DEST_2}  # two variables with one value
    recorded = input_digests(make_settings(same), INVENTORY, SALT)
    text = recorded.model_dump_json()
    assert not any(value in text for value in [DEST_1, DEST_2, PASSWORD, DOTENV["NARWHAL_ENGINE_API_KEY"], "demo"])
    assert "NARWHAL_NODE_2_SSH_PASSWORD" not in recorded.digests and "NARWHAL_ENGINE_API_KEY" not in recorded.digests
    assert recorded.digests["NARWHAL_NODE_1_SSH"] != recorded.digests["NARWHAL_NODE_2_SSH"]
    other_salt = input_digests(make_settings(same), INVENTORY, "a5" * 32)
    assert set(other_salt.digests.values()).isdisjoint(recorded.digests.values())
    assert input_digests(make_settings(same), INVENTORY, SALT) == recorded


def test_private_tree_paths() -> None:
    tree = [".env.example", ".env", "app/.env", "app/main.py", "config/hosts.example.json", "config/hosts.local.json",
            "runs/discovery/x/node-1.json", "runs/discoveryx", "docs/.env.md", "config/ssh.known_hosts"]  # fmt: skip
    private = ["config/hosts.local.json", "config/ssh.known_hosts", "runs/discovery"]
    assert private_tree_paths(tree, private) == [".env", "app/.env", "config/hosts.local.json",
                                                 "runs/discovery/x/node-1.json", "config/ssh.known_hosts"]  # fmt: skip


def test_needles_match_whole_tokens_only() -> None:
    needle = Needle("destination", "gpu-a")
    assert needle.found_in("export X='gpu-a'") and needle.found_in("ssh gpu-a\n") and needle.found_in("gpu-a")
    assert not needle.found_in("gpu-ab") and not needle.found_in("my-gpu-a") and not needle.found_in("ops@gpu-a")
    assert Needle("key", "AAAA", whole_token=False).found_in("xAAAAx")


# --- layout: which files each host gets and where install puts them -------------------------------------


def test_a_router_only_host_gets_its_role_file_fleet_and_limits_but_no_engine_tools() -> None:
    router_host = HostEntry(id="router", ssh_env="NARWHAL_ROUTER_SSH", roles=["router"])
    published = PublishedSet(launch=EngineLaunchConfig(engines={}), fleet_bytes=b"{fleet}\n",
                             profiling_limits_bytes=b"{limits}\n", fleet_roles={1: "prefill", 2: "decode"})  # fmt: skip
    environments = build()
    files = host_files(router_host, environments, published, tools={})
    assert [(f.path, f.install_to, f.keep_if_present) for f in files] == [
        ("router/.env.router", "runs/deployment/.env.router", False),
        ("router/fleet.local.json", "runs/deployment/fleet.json", True),
        ("router/profiling-limits.json", "runs/deployment/profiling-limits.json", False),
    ]
    assert files[0].data == environments["router"].render().encode()
    assert [f.prepared().size for f in files[1:]] == [8, 9]


def test_an_engine_missing_from_the_fleet_is_an_error() -> None:
    published = PublishedSet(launch=EngineLaunchConfig(engines={}), fleet_bytes=b"", profiling_limits_bytes=b"",
                             fleet_roles={1: "prefill"})  # fmt: skip
    with pytest.raises(InputError) as info:
        host_files(INVENTORY.hosts[1], build(), published, tools={})
    assert info.value.problems == ["fleet: engines: no engine n2 for engine-2; run `deploy-hosts discover`"]

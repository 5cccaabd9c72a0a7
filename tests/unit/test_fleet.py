"""`config/fleet.json`: shape, roles, references, engine credential and hardware consistency."""

from __future__ import annotations

import json

import pytest
from helpers.launch_inputs import colocated, gpu, make_settings, observation, two_hosts

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.inventory import HostEntry, Inventory
from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.fleet import Fleet, build_fleet, fleet_references
from narwhal_assets.core.launch.launch_records import build_launch_records


def fleet_for(settings=None, hosts=None) -> Fleet:
    settings = settings or make_settings()
    inventory, observations = hosts or two_hosts()
    launch = build_launch_records(settings, inventory, observations).config
    return build_fleet(settings, inventory, observations, launch)


def test_fleet_json_matches_the_reference_shape() -> None:
    data = json.loads(render_json(fleet_for()))
    assert data == {
        "schema": "narwhal.fleet",
        "schema_version": 1,
        "model": "llama-3.1-8b",
        "hardware": {"accelerator": "NVIDIA H100 80GB HBM3", "accelerators_per_engine": 2, "tensor_parallel": 2},
        "engines": [
            {"iid": "n1", "url": "${NARWHAL_NODE_1_URL}", "attestation_url": "${NARWHAL_NODE_1_ATTESTATION_URL}",
             "role": "prefill"},
            {"iid": "n2", "url": "${NARWHAL_NODE_2_URL}", "attestation_url": "${NARWHAL_NODE_2_ATTESTATION_URL}",
             "role": "decode"},
        ],
        "slo": {"ttft_s": 10, "tpot_s": 0.125},
        "controller": {"min_prefill": 1, "min_decode": 1, "thresholds": {"expand": 1.0, "shrink": 0.5}},
        "profiles": {"path": "runs/profiles.json"},
    }
    assert Fleet.model_validate(data) == fleet_for()


def test_references_are_whole_values_without_ssh() -> None:
    fleet = fleet_for()
    assert fleet_references(fleet) == {"NARWHAL_NODE_1_URL", "NARWHAL_NODE_1_ATTESTATION_URL",
                                       "NARWHAL_NODE_2_URL", "NARWHAL_NODE_2_ATTESTATION_URL"}
    edited = fleet.model_copy(update={"engines": [
        fleet.engines[0].model_copy(update={"url": "http://${NARWHAL_NODE_1_IP}:8000"}),
        fleet.engines[1].model_copy(update={"url": "${NARWHAL_NODE_2_SSH}",
                                            "attestation_url": "${lower_case}"}),
    ]})
    assert fleet_references(edited) == {"NARWHAL_NODE_1_ATTESTATION_URL"}


def test_roles_are_configurable_per_node() -> None:
    settings = make_settings({"NARWHAL_NODE_1_ROLE": "decode", "NARWHAL_NODE_2_ROLE": "prefill"})
    fleet = fleet_for(settings)
    assert [(e.iid, e.role) for e in fleet.engines] == [("n1", "decode"), ("n2", "prefill")]
    assert fleet.role_of(2) == "prefill"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"NARWHAL_NODE_2_ROLE": "prefill"}, "fleet: no decode engine; set NARWHAL_NODE_<n>_ROLE"),
        ({"NARWHAL_NODE_1_ROLE": "decode"}, "fleet: no prefill engine"),
        ({"NARWHAL_NODE_2_ROLE": "both"}, "engine-2: NARWHAL_NODE_2_ROLE must be prefill or decode"),
    ],
)
def test_role_errors(overrides: dict[str, str], expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        fleet_for(make_settings(overrides))


def test_engine_credential_is_named_only_when_configured() -> None:
    assert fleet_for().engine is None
    assert "engine" not in json.loads(render_json(fleet_for()))
    fleet = fleet_for(make_settings({"NARWHAL_ENGINE_API_KEY": "sentinel-key-value"}))
    assert fleet.engine is not None and fleet.engine.engine_api_key_env == "NARWHAL_ENGINE_API_KEY"
    assert "sentinel-key-value" not in render_json(fleet)
    named = fleet_for(make_settings({"NARWHAL_ENGINE_API_KEY_ENV": "ROUTER_ENGINE_KEY",
                                     "ROUTER_ENGINE_KEY": "sentinel"}))
    assert named.engine is not None and named.engine.engine_api_key_env == "ROUTER_ENGINE_KEY"
    assert fleet_for(make_settings({"NARWHAL_ENGINE_API_KEY": ""})).engine is None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"NARWHAL_ENGINE_API_KEY_ENV": "ROUTER_ENGINE_KEY"}, "NARWHAL_ENGINE_API_KEY_ENV names ROUTER_ENGINE_KEY, "
                                                              "which is unset or empty"),
        ({"NARWHAL_ENGINE_API_KEY_ENV": "NARWHAL_NODE_1_SSH"}, "must name an upper-case variable without SSH"),
        ({"NARWHAL_ENGINE_API_KEY_ENV": "lower"}, "must name an upper-case variable"),
    ],
)
def test_engine_credential_errors(overrides: dict[str, str], expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        fleet_for(make_settings({**overrides, "NARWHAL_NODE_1_SSH": "alice@host"}))


def test_mismatched_gpu_product_is_refused() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], gpus=[gpu(0, "NVIDIA A100"), gpu(1, "NVIDIA A100")],
                                         ip="198.18.0.2")
    with pytest.raises(InputError) as info:
        fleet_for(hosts=(inventory, observations))
    assert ("config/engine-launch.local.json: engines.*.accelerator: engines differ in GPU product "
            "(engine-1: NVIDIA H100 80GB HBM3; engine-2: NVIDIA A100)") in str(info.value)


def test_mismatched_gpu_count_and_tp_are_refused() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], gpus=4, ip="198.18.0.2")
    with pytest.raises(InputError) as info:
        fleet_for(hosts=(inventory, observations))
    message = str(info.value)
    assert "engines.*.gpu_ids: engines differ in GPU count (engine-1: 2; engine-2: 4)" in message
    assert "engines.*.tensor_parallel_size: engines differ in tensor-parallel size" in message


def test_fewer_than_two_engines_is_refused() -> None:
    inventory = Inventory(hosts=[HostEntry(id="node-1", ssh_env="NARWHAL_NODE_1_SSH", roles=["router", "engine-1"])])
    observations = {"node-1": observation("node-1", ["router", "engine-1"])}
    settings = make_settings()
    launch = build_launch_records(settings, inventory, observations).config
    with pytest.raises(InputError, match=r"the fleet needs at least two engines .*found 1"):
        build_fleet(settings, inventory, observations, launch)


def test_missing_model_name_is_refused() -> None:
    settings = make_settings()
    inventory, observations = two_hosts()
    launch = build_launch_records(settings, inventory, observations).config
    without = make_settings(base={})
    with pytest.raises(InputError, match="engine-1: NARWHAL_ENGINE_MODEL_NAME is unset; it is required"):
        build_fleet(without, inventory, observations, launch)
    differing = make_settings({"NARWHAL_NODE_2_ENGINE_MODEL_NAME": "other"})
    with pytest.raises(InputError, match="engines serve different model names"):
        build_fleet(differing, inventory, observations, launch)


def test_missing_launch_record_or_observation_is_refused() -> None:
    settings = make_settings()
    inventory, observations = two_hosts()
    launch = build_launch_records(settings, inventory, observations).config
    partial = launch.model_copy(update={"engines": {"engine-1": launch.engines["engine-1"]}})
    with pytest.raises(InputError) as info:
        build_fleet(settings, inventory, {"node-1": observations["node-1"]}, partial)
    assert "host node-2: no observation for engine-2" in str(info.value)
    assert "config/engine-launch.local.json: engines: no record for engine-2" in str(info.value)


def test_colocated_fleet_has_three_engines() -> None:
    settings = make_settings({
        "NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_NODE_2_GPU_IDS": "2,3", "NARWHAL_NODE_2_ENGINE_PORT": "8100",
        "NARWHAL_NODE_2_ATTEST_PORT": "8101", "NARWHAL_NODE_2_NIXL_SIDE_CHANNEL_PORT": "5700",
        "NARWHAL_NODE_2_UCX_TCP_PORT_RANGE": "51000-51999",
    })
    fleet = fleet_for(settings, colocated())
    assert [(e.iid, e.role) for e in fleet.engines] == [("n1", "prefill"), ("n2", "decode"), ("n3", "decode")]

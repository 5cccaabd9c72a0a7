"""`config/deployment.env`: per-node fabric addresses, URLs, image ids and config hashes, and their errors."""

from __future__ import annotations

import pytest
from helpers.launch_inputs import CONFIG_SHA, IMAGE_ID, make_settings, observation, two_hosts

from narwhal_assets.core.errors import InputError
from narwhal_assets.core.inputs.envfile import parse_env_text
from narwhal_assets.core.launch.deployment_env import build_deployment_env, render_deployment_env


def env_for(settings=None, hosts=None) -> dict[str, str]:
    inventory, observations = hosts or two_hosts()
    return build_deployment_env(settings or make_settings(), inventory, observations)


def problems_of(settings=None, hosts=None) -> str:
    with pytest.raises(InputError) as info:
        env_for(settings, hosts)
    return str(info.value)


def test_values_per_engine_node() -> None:
    assert env_for(make_settings({"NARWHAL_NODE_2_ENGINE_PORT": "8100"})) == {
        "NARWHAL_NODE_1_IP": "198.18.0.1",
        "NARWHAL_NODE_1_URL": "http://198.18.0.1:8000",
        "NARWHAL_NODE_1_ATTESTATION_URL": "http://198.18.0.1:8001/v1/attestation",
        "NARWHAL_NODE_1_ENGINE_IMAGE": IMAGE_ID,
        "NARWHAL_NODE_1_MODEL_CONFIG_SHA256": CONFIG_SHA,
        "NARWHAL_NODE_2_IP": "198.18.0.2",
        "NARWHAL_NODE_2_URL": "http://198.18.0.2:8100",
        "NARWHAL_NODE_2_ATTESTATION_URL": "http://198.18.0.2:8001/v1/attestation",
        "NARWHAL_NODE_2_ENGINE_IMAGE": IMAGE_ID,
        "NARWHAL_NODE_2_MODEL_CONFIG_SHA256": CONFIG_SHA,
    }


def test_the_image_tag_in_env_does_not_block_discovery() -> None:
    """Discovery pins the image; before it, NARWHAL_ENGINE_IMAGE is usually a tag."""
    values = env_for(make_settings({"NARWHAL_ENGINE_IMAGE": "vllm/vllm-openai:v0.10"}))
    assert values["NARWHAL_NODE_1_ENGINE_IMAGE"] == IMAGE_ID


def test_ipv4_is_preferred_and_ipv6_is_bracketed() -> None:
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"],
                                         addresses=[("inet6", "2001:db8::1"), ("inet", "198.18.0.1")])
    observations["node-2"] = observation("node-2", ["engine-2"],
                                         addresses=[("inet6", "fe80::2"), ("inet6", "2001:db8::2")])
    values = env_for(hosts=(inventory, observations))
    assert values["NARWHAL_NODE_1_IP"] == "198.18.0.1"
    assert values["NARWHAL_NODE_2_IP"] == "2001:db8::2"
    assert values["NARWHAL_NODE_2_URL"] == "http://[2001:db8::2]:8000"
    assert values["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://[2001:db8::2]:8001/v1/attestation"


def test_per_node_fabric_interface() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], interface="ib0", ip="198.19.0.2")
    values = env_for(make_settings({"NARWHAL_NODE_2_FABRIC_INTERFACE": "ib0"}), (inventory, observations))
    assert values["NARWHAL_NODE_2_IP"] == "198.19.0.2"


def test_missing_interface_names_host_and_interface() -> None:
    message = problems_of(make_settings({"NARWHAL_NODE_2_FABRIC_INTERFACE": "ib0"}))
    assert "host node-2: fabric interface 'ib0' (NARWHAL_NODE_2_FABRIC_INTERFACE) not found" in message


def test_interface_without_global_address() -> None:
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"], addresses=[("inet6", "fe80::1")])
    message = problems_of(hosts=(inventory, observations))
    assert "host node-1: fabric interface 'eth1' (NARWHAL_FABRIC_INTERFACE) has no global IPv4 or IPv6" in message


def test_duplicate_fabric_addresses_across_hosts() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], ip="198.18.0.1")
    assert "hosts node-1 and node-2: same fabric address 198.18.0.1 (engine-2)" in problems_of(
        hosts=(inventory, observations))


def test_image_must_resolve_to_an_immutable_id() -> None:
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"], image_id=None)
    observations["node-2"] = observation("node-2", ["engine-2"], image_id="vllm/vllm-openai:v0.10", ip="198.18.0.2")
    message = problems_of(hosts=(inventory, observations))
    assert "host node-1: engine-1 image was not observed" in message
    assert "host node-2: engine-2 image 'vllm/vllm-openai:v0.10' did not resolve to an immutable sha256" in message


def test_config_hash_must_match_an_operator_pin() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], config_sha="e" * 64, ip="198.18.0.2")
    message = problems_of(hosts=(inventory, observations))
    assert ("host node-2: engine-2 config.json SHA-256 eeeeeeeeeeee... differs from the pinned "
            "NARWHAL_MODEL_CONFIG_SHA256") in message
    assert "engine-1" not in message
    unpinned = make_settings(base={"NARWHAL_FABRIC_INTERFACE": "eth1"})
    assert env_for(unpinned, (inventory, observations))["NARWHAL_NODE_2_MODEL_CONFIG_SHA256"] == "e" * 64


def test_a_previously_discovered_hash_is_not_a_pin() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"], config_sha="e" * 64, ip="198.18.0.2")
    base = {"NARWHAL_FABRIC_INTERFACE": "eth1"}
    settings = make_settings(base=base, discovered={"NARWHAL_NODE_2_MODEL_CONFIG_SHA256": CONFIG_SHA})
    assert env_for(settings, (inventory, observations))["NARWHAL_NODE_2_MODEL_CONFIG_SHA256"] == "e" * 64
    node_pin = make_settings(base=base, process={"NARWHAL_NODE_2_MODEL_CONFIG_SHA256": CONFIG_SHA})
    assert "pinned NARWHAL_NODE_2_MODEL_CONFIG_SHA256" in problems_of(node_pin, (inventory, observations))


def test_missing_model_or_observation() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observations["node-2"].model_copy(update={"models": {}})
    assert "host node-2: the model directory of engine-2 was not observed" in problems_of(
        hosts=(inventory, observations))
    del observations["node-2"]
    assert "host node-2: no observation for engine-2 (run discovery)" in problems_of(hosts=(inventory, observations))


def test_bad_ports_and_empty_overrides_name_the_variable() -> None:
    message = problems_of(make_settings({"NARWHAL_NODE_1_ENGINE_PORT": "", "NARWHAL_ATTEST_PORT": "x"}))
    assert "NARWHAL_NODE_1_ENGINE_PORT is set but empty" in message
    assert "engine-2: NARWHAL_ATTEST_PORT must be a port number" in message


def test_render_is_sorted_exports_that_parse_back() -> None:
    values = env_for()
    text = render_deployment_env(values)
    assert text.startswith("# config/deployment.env: generated by discovery")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == sorted(lines)
    assert all(line.startswith("export NARWHAL_NODE_") for line in lines)
    assert parse_env_text(text, "config/deployment.env") == values

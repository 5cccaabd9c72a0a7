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


def test_ipv6_is_bracketed_and_a_link_local_address_is_no_candidate() -> None:
    inventory, observations = two_hosts()
    observations["node-2"] = observation("node-2", ["engine-2"],
                                         addresses=[("inet6", "fe80::2"), ("inet6", "2001:db8::2")])  # fmt: skip
    values = env_for(hosts=(inventory, observations))
    assert values["NARWHAL_NODE_2_IP"] == "2001:db8::2"
    assert values["NARWHAL_NODE_2_URL"] == "http://[2001:db8::2]:8000"
    assert values["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://[2001:db8::2]:8001/v1/attestation"


def test_two_global_addresses_are_refused_until_the_node_ip_chooses_one_of_them() -> None:
    """Taking the first silently would advertise an address nobody chose (the serving fleet refuses too)."""
    inventory, observations = two_hosts()
    observations["node-1"] = observation("node-1", ["router", "engine-1"],
                                         addresses=[("inet6", "2001:db8::1"), ("inet", "198.18.0.1")])  # fmt: skip
    hosts = (inventory, observations)
    assert ("host node-1: fabric interface 'eth1' (NARWHAL_FABRIC_INTERFACE) has 2 global addresses (2001:db8::1, "
            "198.18.0.1); set NARWHAL_NODE_1_IP to the one NIXL should use") in problems_of(hosts=hosts)
    values = env_for(make_settings({"NARWHAL_NODE_1_IP": "2001:db8::1"}), hosts)
    assert (values["NARWHAL_NODE_1_IP"], values["NARWHAL_NODE_1_URL"]) == ("2001:db8::1", "http://[2001:db8::1]:8000")
    assert "NARWHAL_NODE_1_IP must be written as 2001:db8::1" in problems_of(
        make_settings({"NARWHAL_NODE_1_IP": "2001:DB8:0::1"}), hosts)


def test_a_node_ip_on_no_observed_interface_is_refused_not_exported() -> None:
    """The address must be one discovery saw, or the role files and the launch records would disagree."""
    message = problems_of(make_settings({"NARWHAL_NODE_1_IP": "203.0.113.77"}))
    assert ("NARWHAL_NODE_1_IP is not a global address of host node-1's fabric interface 'eth1' (observed: "
            "198.18.0.1); set it to one of them or remove it") in message
    assert "must be an IP address" in problems_of(make_settings({"NARWHAL_NODE_2_IP": "node-two"}))
    assert env_for(make_settings({"NARWHAL_NODE_2_IP": "198.18.0.2"}))["NARWHAL_NODE_2_IP"] == "198.18.0.2"


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("NARWHAL_NODE_1_ATTESTATION_URL", "http://10.0.0.1:8001/v1/attest", "must be an HTTP service URL "
                                                                             "http://HOST:PORT/v1/attestation"),
        ("NARWHAL_NODE_1_ATTESTATION_URL", "https://10.0.0.1:8001/v1/attestation", "must be an HTTP service URL"),
        ("NARWHAL_NODE_1_ATTESTATION_URL", "http://10.0.0.1/v1/attestation", "must be an HTTP service URL"),
        ("NARWHAL_NODE_1_ATTESTATION_URL", "http://u:p@10.0.0.1:8001/v1/attestation", "must be an HTTP service URL"),
        ("NARWHAL_NODE_1_ATTESTATION_URL", "http://10.0.0.1:8001/v1/attestation?x=1", "must be an HTTP service URL"),
        ("NARWHAL_NODE_1_URL", "http://10.0.0.1:8000/v1", "must be an HTTP service URL http://HOST:PORT (no"),
        ("NARWHAL_NODE_1_URL", "http://10.0.0.1:99999", "must be an HTTP service URL"),
        ("NARWHAL_NODE_1_URL", "http://10.0.0.1:9000", "must use the engine port 8000"),
    ],
)
def test_a_malformed_service_url_override_is_refused(name: str, value: str, problem: str) -> None:
    assert f"{name} {problem}" in problems_of(make_settings({name: value}))


def test_a_well_formed_service_url_override_is_what_discovery_records() -> None:
    values = env_for(make_settings({"NARWHAL_NODE_1_URL": "http://engine-1.example.invalid:8000",
                                    "NARWHAL_NODE_2_ATTESTATION_URL": "http://[fd00::2]:9001/v1/attestation"}))
    assert values["NARWHAL_NODE_1_URL"] == "http://engine-1.example.invalid:8000"
    assert values["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://[fd00::2]:9001/v1/attestation"


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

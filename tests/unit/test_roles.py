"""`Role` is the one place that spells role names, fleet iids and per-node variables."""

from __future__ import annotations

import pytest

from narwhal_assets.core.roles import Role, engine_number, node_variable

NOT_ROLES = ["engine-0", "engine-01", "engine-", "Engine-1", "engine-1 ", "routers", "engine-1234567"]


@pytest.mark.parametrize("name", NOT_ROLES)
def test_anything_but_router_or_engine_n_is_not_a_role(name: str) -> None:
    assert Role.parse(name) is None and engine_number(name) is None


def test_engine_role_derives_its_names() -> None:
    role = Role.parse("engine-12")
    assert role == Role.engine(12) and role.is_engine
    assert (role.iid, role.node_prefix, role.ssh_env) == ("n12", "NARWHAL_NODE_12_", "NARWHAL_NODE_12_SSH")
    assert role.node_var("NARWHAL_ENGINE_PORT") == role.node_var("ENGINE_PORT") == "NARWHAL_NODE_12_ENGINE_PORT"
    assert (role.env_file, role.launch_file) == (".env.engine-12", "engine-launch.engine-12.json")
    assert node_variable("NARWHAL_NODE_12_ENGINE_PORT") == (12, "ENGINE_PORT")


def test_router_sorts_first_and_has_no_engine_names() -> None:
    router = Role.parse("router")
    assert router == Role.router() and not router.is_engine and router.ssh_env == "NARWHAL_ROUTER_SSH"
    assert sorted([Role.engine(10), router, Role.engine(2)]) == [router, Role.engine(2), Role.engine(10)]
    with pytest.raises(ValueError, match="router is not an engine role"):
        _ = router.iid

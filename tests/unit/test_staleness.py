"""Which settings changed since a run was prepared: only values that came from a setting, compared by name
through the value digests `sources.json` holds (no role file is read)."""

from __future__ import annotations

from pathlib import Path

from narwhal_assets.core.inputs.settings import Layer, Settings
from narwhal_assets.core.prepared_run.role_env import (
    ExportLayer,
    RoleFileSources,
    RoleSources,
    VariableSource,
    value_hmac,
)
from narwhal_assets.core.prepared_run.staleness import changed_settings

SALT = "5a" * 32
PREPARED = {"NARWHAL_ENGINE_MODEL_NAME": "demo", "NARWHAL_ENGINE_PORT": "8001", "NARWHAL_NODE_2_IP": "10.0.0.2"}


def source(layer: ExportLayer, variable: str) -> VariableSource:
    return VariableSource(layer=layer, variable=variable, reason="engine field",
                          value_hmac=value_hmac(SALT, variable, PREPARED[variable]))  # fmt: skip


SOURCES = RoleSources(
    revision="a" * 40,
    salt=SALT,
    every_engine={"NARWHAL_NODE_2_IP": source(ExportLayer.DEPLOYMENT_ENV, "NARWHAL_NODE_2_IP")},
    roles={
        "engine-1": RoleFileSources(host_id="node-1", file="node-1/.env.engine-1", variables={
            "NARWHAL_ENGINE_MODEL_NAME": source(ExportLayer.DOTENV, "NARWHAL_ENGINE_MODEL_NAME"),
            "NARWHAL_ENGINE_PORT": source(ExportLayer.DEFAULT, "NARWHAL_ENGINE_PORT"),
            "NARWHAL_ENGINE_LAUNCH_CONFIG": VariableSource(layer=ExportLayer.PREPARE, reason="the launch record"),
        }),
        "router": RoleFileSources(host_id="node-1", file="node-1/.env.router", variables={
            "NARWHAL_FLEET": VariableSource(layer=ExportLayer.PREPARE, reason="the router reads its fleet here"),
        }),
    },
)  # fmt: skip


def settings(**dotenv: str) -> Settings:
    base = {"NARWHAL_ENGINE_PORT": "8001", "NARWHAL_NODE_2_IP": "10.0.0.2"}
    return Settings(Path("/checkout"), ((Layer.DEFAULT, base), (Layer.DOTENV, dotenv)))


def test_nothing_changed_is_not_stale() -> None:
    assert changed_settings(SOURCES, settings(NARWHAL_ENGINE_MODEL_NAME="demo")) == []


def test_a_changed_or_removed_setting_is_named_and_prepare_values_are_not_settings() -> None:
    assert changed_settings(SOURCES, settings(NARWHAL_ENGINE_MODEL_NAME="new")) == ["NARWHAL_ENGINE_MODEL_NAME"]
    assert changed_settings(SOURCES, settings(NARWHAL_ENGINE_PORT="9000", NARWHAL_ENGINE_MODEL_NAME="demo")) == [
        "NARWHAL_ENGINE_PORT"]
    assert changed_settings(SOURCES, settings()) == ["NARWHAL_ENGINE_MODEL_NAME"]


def test_what_every_engine_shares_counts_for_engine_roles_only() -> None:
    moved = settings(NARWHAL_ENGINE_MODEL_NAME="demo", NARWHAL_NODE_2_IP="10.0.0.9")
    assert changed_settings(SOURCES, moved) == ["NARWHAL_NODE_2_IP"]
    assert changed_settings(SOURCES, moved, roles=["router"]) == []
    assert changed_settings(SOURCES, moved, roles=["engine-1"]) == ["NARWHAL_NODE_2_IP"]

"""Which settings changed since a run was prepared: only values that came from a setting, compared by name."""

from __future__ import annotations

from pathlib import Path

from narwhal_assets.core.deployment.role_env import ExportLayer, RoleFileSources, RoleSources, VariableSource
from narwhal_assets.core.deployment.staleness import changed_settings
from narwhal_assets.core.inputs.settings import Layer, Settings

ENGINE_1 = "node-1/.env.engine-1"
SOURCES = RoleSources(revision="a" * 40, roles={"engine-1": RoleFileSources(host_id="node-1", file=ENGINE_1,
    variables={
        "NARWHAL_ENGINE_MODEL_NAME": VariableSource(layer=ExportLayer.DOTENV, variable="NARWHAL_ENGINE_MODEL_NAME",
                                                    reason="engine field"),
        "NARWHAL_ENGINE_PORT": VariableSource(layer=ExportLayer.DEFAULT, variable="NARWHAL_ENGINE_PORT",
                                              reason="engine field"),
        "NARWHAL_FLEET": VariableSource(layer=ExportLayer.PREPARE, reason="the router reads its fleet here"),
    })})  # fmt: skip
PREPARED = {"node-1/.env.engine-1": {"NARWHAL_ENGINE_MODEL_NAME": "demo", "NARWHAL_ENGINE_PORT": "8001",
                                     "NARWHAL_FLEET": "runs/deployment/fleet.json"}}  # fmt: skip


def settings(**dotenv: str) -> Settings:
    return Settings(Path("/checkout"), ((Layer.DEFAULT, {"NARWHAL_ENGINE_PORT": "8001"}), (Layer.DOTENV, dotenv)))


def test_nothing_changed_is_not_stale() -> None:
    assert changed_settings(SOURCES, PREPARED, settings(NARWHAL_ENGINE_MODEL_NAME="demo")) == []


def test_a_changed_or_removed_setting_is_named_and_prepare_values_are_not_settings() -> None:
    assert changed_settings(SOURCES, PREPARED, settings(NARWHAL_ENGINE_MODEL_NAME="new")) == [
        "NARWHAL_ENGINE_MODEL_NAME"
    ]
    assert changed_settings(SOURCES, PREPARED, settings(NARWHAL_ENGINE_PORT="9000", NARWHAL_ENGINE_MODEL_NAME="demo")) \
        == ["NARWHAL_ENGINE_PORT"]
    assert changed_settings(SOURCES, PREPARED, settings()) == ["NARWHAL_ENGINE_MODEL_NAME"]

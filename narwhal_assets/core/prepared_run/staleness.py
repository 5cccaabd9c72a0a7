"""Is a prepared run stale? The operator's settings whose current value differs from what its role files hold.

`sources.json` says, for every exported variable of every role file, which setting it came from and the
HMAC of the value prepare wrote (keyed by the run's salt). A variable that came from a setting (`.env`, the
process environment, `config/deployment.env` or a default) and whose setting now resolves to another value
was changed since the run was prepared: installing it ships the old value. No role file is read, so the
check costs the size of `sources.json` (linear in the roles), not the size of every role file. Names only,
never values. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from narwhal_assets.core.inputs.settings import Settings
from narwhal_assets.core.prepared_run.role_env import ExportLayer, RoleSources, VariableSource, value_hmac
from narwhal_assets.core.roles import engine_number


def changed_settings(sources: RoleSources, settings: Settings, roles: Iterable[str] | None = None) -> list[str]:
    """Sorted setting names whose current value differs from the prepared one, among the variables of `roles`
    (role names; default every role of the run)."""
    names = list(sources.roles) if roles is None else list(roles)
    checked: list[VariableSource] = [source for name in names for source in sources.roles[name].variables.values()]
    if any(engine_number(name) is not None for name in names):
        checked += sources.every_engine.values()
    changed = set()
    for source in checked:
        if source.layer is ExportLayer.PREPARE or not source.variable or source.value_hmac is None:
            continue
        if value_hmac(sources.salt, source.variable, settings.get(source.variable) or "") != source.value_hmac:
            changed.add(source.variable)
    return sorted(changed)

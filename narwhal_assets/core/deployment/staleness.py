"""Is a prepared run stale? The operator's settings whose current value differs from what its role files hold.

`sources.json` says, for every exported variable of every role file, which setting it came from; the role
file holds the value prepare wrote. A variable that came from a setting (`.env`, the process environment,
`config/deployment.env` or a default) and whose setting now resolves to another value was changed since
the run was prepared: installing it ships the old value. Names only, never values. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from narwhal_assets.core.deployment.role_env import ExportLayer, RoleSources
from narwhal_assets.core.inputs.settings import Settings


def changed_settings(
    sources: RoleSources, role_files: Mapping[str, Mapping[str, str]], settings: Settings
) -> list[str]:
    """Sorted setting names whose current value differs from the prepared one; `role_files` maps each role
    file's path in the run (as `sources.json` names it) to its parsed exports."""
    changed: set[str] = set()
    for role in sources.roles.values():
        exported = role_files.get(role.file, {})
        for name, source in role.variables.items():
            if source.layer is ExportLayer.PREPARE or not source.variable or name not in exported:
                continue
            if (settings.get(source.variable) or "") != exported[name]:
                changed.add(source.variable)
    return sorted(changed)

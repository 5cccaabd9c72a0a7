"""Roles: the router and numbered engines. The one place that spells `engine-<n>`, `n<n>` and `NARWHAL_NODE_<n>_`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

ROUTER = "router"
ENGINE_ROLE_RE = re.compile(r"engine-([1-9][0-9]{0,5})")
ROUTER_SSH = "NARWHAL_ROUTER_SSH"
PASSWORD_SUFFIX = "_PASSWORD"
NODE_VARIABLE_RE = re.compile(r"NARWHAL_NODE_([1-9][0-9]{0,5})_([A-Z0-9_]+)")


@total_ordering
@dataclass(frozen=True)
class Role:
    """A role name with what derives from it. The router sorts first, engines by number."""

    name: str
    number: int | None = None

    @classmethod
    def parse(cls, name: str) -> Role | None:
        """`router` or `engine-<n>` (no leading zero); anything else is None."""
        if name == ROUTER:
            return cls(ROUTER)
        match = ENGINE_ROLE_RE.fullmatch(name)
        return cls(name, int(match.group(1))) if match else None

    @classmethod
    def engine(cls, number: int) -> Role:
        return cls(f"engine-{number}", number)

    @classmethod
    def router(cls) -> Role:
        return cls(ROUTER)

    @property
    def is_engine(self) -> bool:
        return self.number is not None

    @property
    def iid(self) -> str:
        """The engine's id in the router's fleet (`n<n>`)."""
        return f"n{self._engine_number()}"

    @property
    def node_prefix(self) -> str:
        """Per-node variables insert `NODE_<n>_` after `NARWHAL_`."""
        return f"NARWHAL_NODE_{self._engine_number()}_"

    def node_var(self, field: str) -> str:
        """`NARWHAL_NODE_<n>_<FIELD>` for a shared field name given with or without the `NARWHAL_` prefix."""
        return self.node_prefix + field.removeprefix("NARWHAL_")

    @property
    def ssh_env(self) -> str:
        """The variable holding this role's management destination."""
        return self.node_var("SSH") if self.is_engine else ROUTER_SSH

    @property
    def env_file(self) -> str:
        """The role environment's file name (`.env.router`, `.env.engine-<n>`)."""
        return f".env.{self.name}"

    @property
    def launch_file(self) -> str:
        """The per-engine launch file a role environment points at."""
        return f"engine-launch.{self.name}.json"

    def _engine_number(self) -> int:
        if self.number is None:
            raise ValueError(f"{self.name} is not an engine role")
        return self.number

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return (self.number or 0, self.name) < (other.number or 0, other.name)

    def __str__(self) -> str:
        return self.name


def engine_number(role: str) -> int | None:
    """`engine-3` -> 3; any other role -> None."""
    parsed = Role.parse(role)
    return parsed.number if parsed else None


def node_variable(name: str) -> tuple[int, str] | None:
    """`NARWHAL_NODE_2_ENGINE_PORT` -> (2, "ENGINE_PORT"); any other name -> None."""
    match = NODE_VARIABLE_RE.fullmatch(name)
    return (int(match.group(1)), match.group(2)) if match else None

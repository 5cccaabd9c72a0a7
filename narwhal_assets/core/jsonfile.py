"""Reading and rendering the generated JSON files through their pydantic models.

Read errors name the file and the field, never a value, so a damaged file is fixed in one pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from narwhal_assets.core.errors import InputError

M = TypeVar("M", bound=BaseModel)


def render_json(model: BaseModel) -> str:
    """The on-disk form: schema field names (aliases), two-space indent, trailing newline."""
    return model.model_dump_json(by_alias=True, indent=2, exclude_none=True) + "\n"


def load_json_model(path: Path, model: type[M]) -> M:
    """Parse `path` as `model`; every problem is one line naming the file and field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([f"{path}: not found"]) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError([f"{path}: not readable JSON ({type(exc).__name__})"]) from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise InputError([f"{path}: {_loc(err['loc'])}: {err['msg']}" for err in exc.errors()]) from None


def _loc(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))

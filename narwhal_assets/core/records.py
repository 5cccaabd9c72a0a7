"""What every generated file format shares: a strict, immutable pydantic base and the common field shapes."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

SHA256_RE = re.compile(r"[0-9a-f]{64}")
IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")


class Record(BaseModel):
    """Unknown fields are errors (a typo in a file must not pass silently); values cannot change once read."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

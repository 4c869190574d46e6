"""What the Offloader reads of the inspector (the verdict schema and the default prompt), for tests that
drive the Offloader without loading a model."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def stand_in_inspector(schema: dict[str, Any], prompt: str = "Is there a defect?") -> Any:
    return SimpleNamespace(bundle=SimpleNamespace(manifest=SimpleNamespace(verdict_schema=schema)),
                           default_prompt=prompt)

"""What the governor allows the cameras now (the power governor implements `Gate`; capture asks it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class GateDecision:
    """What the governor allows now: a rate factor (1 = configured rate) or a pause."""

    rate_factor: float = 1.0
    paused: bool = False
    state: dict[str, Any] | None = None


class Gate(Protocol):
    def decision(self) -> GateDecision: ...


class OpenGate:
    """No governor: always full rate."""

    def decision(self) -> GateDecision:
        return GateDecision()

"""The app's rails per request, from the live config: compiled once per config object, their
firings logged and counted on /metrics."""

from __future__ import annotations

import logging
from typing import Any

from flask import current_app

from edge_runtime.api.rails.engine import Fire, Rails, ReaskWindow
from edge_runtime.config.rails import RailsConfig

log = logging.getLogger(__package__)  # edge_runtime.api.rails: the name its log lines always had


class RailsState:
    """The app's rails: compiled once per config object (a reload brings a new one); the last few are
    kept, so requests that straddle a reload do not compile twice."""

    KEEP = 4

    def __init__(self, fire: Fire) -> None:
        self.window = ReaskWindow()
        self.fire = fire
        self._built: list[tuple[RailsConfig, Rails]] = []  # newest first; holds the configs alive (ids unique)

    def rails_for(self, cfg: RailsConfig) -> Rails:
        built = self._built
        for known, rails in built:
            if known is cfg:
                return rails
        rails = Rails(cfg, self.window, self.fire)
        self._built = [(cfg, rails), *built[: self.KEEP - 1]]
        return rails


def live_rails(cfg: RailsConfig) -> Rails:
    """The rails for this request (the app's compiled copy of the live `rails:` section)."""
    state: RailsState | None = current_app.extensions.get("edge_runtime_rails")
    if state is None:
        metrics = current_app.extensions.get("edge_runtime_metrics")
        state = current_app.extensions.setdefault("edge_runtime_rails", RailsState(_firing(metrics)))
    return state.rails_for(cfg)


def _firing(metrics: Any) -> Fire:
    def fire(code: str, action: str, rid: str, detail: str) -> None:
        log.info("rails: %s %s request %s: %s", code, action, rid, detail)
        if metrics is not None:
            metrics.rail_fired(code, action)

    return fire

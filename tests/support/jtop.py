"""jtop's client where no Jetson exists: the one fake, built from a recording of a real Orin Nano's jtop
service (`tests/fixtures/jtop_orin_nano.json`). Same attributes as `jtop.jtop`: readings, `ok()`, the
settable power mode and clocks (each change recorded), and the context-manager form the doctor uses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "jtop_orin_nano.json"


class RecordedJtop:
    def __init__(self, data: dict[str, Any] | None = None) -> None:
        data = copy.deepcopy(data if data is not None else json.loads(RECORDING.read_text()))
        self.board = {"hardware": {"Model": "NVIDIA Jetson Orin Nano Developer Kit"}}
        self.temperature, self.power = data["temperature"], data["power"]
        self._mode = data["nvpmodel"]
        self.alive = True  # set False to stand for a lost jtop service
        self.actions: list[tuple[str, Any]] = []  # power actions asked for, in order

    def ok(self) -> bool:
        return self.alive

    @property
    def nvpmodel(self) -> Any:
        return self._mode

    @nvpmodel.setter
    def nvpmodel(self, mode: Any) -> None:
        self.actions.append(("nvpmodel", mode))
        self._mode = mode

    @property
    def jetson_clocks(self) -> bool:
        return True

    @jetson_clocks.setter
    def jetson_clocks(self, on: bool) -> None:
        self.actions.append(("jetson_clocks", on))

    def set_temperature(self, celsius: float) -> None:
        for sensor in self.temperature.values():
            if sensor.get("online", True):
                sensor["temp"] = celsius

    def close(self) -> None:
        pass

    def __enter__(self) -> RecordedJtop:
        return self

    def __exit__(self, *_: object) -> None:
        pass

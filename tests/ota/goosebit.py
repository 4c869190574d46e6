"""goosebit, a real DDI server (PyPI, its own venv: `.venv-goosebit`, made by `make test-ota`), for the
fleet suite; and the wave controller that emulates what hawkBit's rollout groups do server-side.

goosebit serves hawkBit's DDI API to devices, keeps a device registry (state, version, log) and
rollouts per *feed* with success and failure counts, and can pause a rollout. It has no rollout
groups, no automatic stop past an error threshold and no cancelAction. So `roll_out` below does
what hawkBit's rollout engine would: each wave is a feed with its own rollout, started only when the
previous wave reached the success threshold; past the error threshold the wave's rollout is paused
and no later wave is created. A cancel is a pause: the server stops offering the deployment, which
the agent treats as withdrawn (docs/ota.md, docs/decisions.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BOOT = """
import asyncio, sys
import uvicorn
from tortoise import Tortoise
from goosebit.db.config import TORTOISE_CONF

async def schema():  # what `aerich upgrade` does for a fresh database
    await Tortoise.init(config=TORTOISE_CONF)
    await Tortoise.generate_schemas(safe=True)
    await Tortoise.close_connections()

asyncio.run(schema())
from goosebit import app
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info", access_log=True)
"""


def goosebit_python() -> Path | None:
    path = Path(os.environ.get("EDGE_GOOSEBIT_PYTHON", ROOT / ".venv-goosebit/bin/python"))
    return path.absolute() if path.exists() else None  # not resolve(): a venv's python is a symlink


class Goosebit:
    """One goosebit process on loopback with a fresh SQLite database; `api` calls its REST API."""

    def __init__(self, python: Path, root: Path, poll_time: str = "00:00:02") -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "goosebit.log"
        env = {**os.environ, "GOOSEBIT_DB_URI": f"sqlite:///{root}/goosebit.sqlite3",
               "GOOSEBIT_ARTIFACTS_DIR": str(root / "artifacts"), "GOOSEBIT_POLL_TIME": poll_time,
               "GOOSEBIT_DEVICE_AUTH__ENABLE": "true", "GOOSEBIT_DEVICE_AUTH__MODE": "strict",
               "GOOSEBIT_TRACK_DEVICE_IP": "false"}
        env.pop("PYTHONPATH", None)
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen([str(python), "-c", BOOT, str(self.port)], cwd=root, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"goosebit did not start: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.3)
        self.user, self.password = "admin@fleet.local", "fleet-test-password"
        self.token = self._form("/setup", {"username": self.user, "password": self.password})["access_token"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    # ---- its API --------------------------------------------------------------------------------------

    def _form(self, path: str, fields: dict[str, str]) -> Any:
        req = urllib.request.Request(self.url + path, data=urllib.parse.urlencode(fields).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def api(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(self.url + "/api/v1" + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read()
        return json.loads(text) if text else None

    def add_devices(self, tokens: dict[str, str]) -> None:
        """Strict device auth: a device exists with its target token before it may poll."""
        for device, token in tokens.items():
            self.api("PUT", "/devices", {"devices": [device], "auth_token": token})

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["id"]: d for d in self.api("GET", "/devices")["devices"]}

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return next(r for r in self.api("GET", "/rollouts")["rollouts"] if r["id"] == rollout_id)

    def start_rollout(self, name: str, feed: str, software_id: int) -> int:
        return int(self.api("PUT", "/rollouts", {"name": name, "feed": feed, "software_id": software_id})["id"])

    def pause(self, rollout_id: int) -> None:
        """Pause, and make it stick: goosebit saves a rollout's whole row when it counts a device's
        result, so a feedback handled at the same moment can write `paused` back to false (seen)."""
        for _ in range(20):
            self.api("PATCH", "/rollouts", {"ids": [rollout_id], "paused": True})
            time.sleep(0.5)
            if self.rollout(rollout_id)["paused"]:
                return
        raise AssertionError(f"rollout {rollout_id} does not stay paused")

    def requests_from(self, device: str) -> int:
        """DDI requests of one device in the access log so far."""
        return sum(1 for line in self.log_path.read_text().splitlines() if f"/controller/v1/{device}" in line)


@dataclass
class Wave:
    number: int
    devices: list[str]
    rollout_id: int = 0
    wall_s: float = 0.0
    success: int = 0
    failure: int = 0
    stopped: bool = False  # the error threshold stopped the rollout here


def state_of(device: dict[str, Any]) -> str:
    """goosebit's update state of a device: unknown, registered, running, error or finished."""
    names = {"1": "unknown", "2": "registered", "3": "running", "4": "error", "5": "finished"}
    value = str(device["last_state"]).lower()
    return names.get(value, value)


def roll_out(gb: Goosebit, release: str, version: str, software_id: int, waves: list[list[str]],
             success_threshold: float, error_threshold: float, timeout_s: float = 300) -> list[Wave]:
    """hawkBit's cascading groups, emulated: wave n+1 starts once wave n reached `success_threshold` (a
    fraction of its devices closed with success); once a wave's failures exceed `error_threshold` no
    later wave is started."""
    done: list[Wave] = []
    for number, devices in enumerate(waves, 1):
        feed = f"{release}-w{number}"
        gb.api("PATCH", "/devices", {"devices": devices, "feed": feed})
        wave = Wave(number, devices, gb.start_rollout(feed, feed, software_id))
        start, deadline = time.monotonic(), time.monotonic() + timeout_s
        while True:
            # Counted per device (each device's own state and version on the server): goosebit's rollout
            # counters are read-modify-write and lose updates when two devices report at once (seen: two
            # failures within 20 ms counted as one).
            server = gb.devices()
            wave.success = sum(1 for i in devices if state_of(server[i]) == "finished"
                               and server[i]["sw_version"] == version)
            wave.failure = sum(1 for i in devices if state_of(server[i]) == "error")
            if wave.failure / len(devices) > error_threshold:
                # hawkBit's errorAction PAUSE: no later group starts; the group's running actions go on.
                wave.stopped = True
                break
            if wave.success / len(devices) >= success_threshold:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"wave {number} of {release}: {wave.success} ok, {wave.failure} failed "
                                     f"of {len(devices)} after {timeout_s} s")
            time.sleep(0.5)
        wave.wall_s = round(time.monotonic() - start, 1)
        done.append(wave)
        if wave.stopped:
            break
    return done

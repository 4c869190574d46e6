"""`doctor` on line I/O: stations bound to cameras, the OPC UA trust list, the endpoints."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from edge_runtime.cli.doctor import Doctor
from edge_runtime.config import CameraConfig, Config
from edge_runtime.config.line_io import LineIOConfig
from edge_runtime.lineio.passwords import hash_password
from tests.support.mjpeg import free_port

STATION = {"name": "st1", "camera": "cam", "nok_when": [{"field": "verdict.defect", "equals": True}]}


def check(tmp_path: Path, line_io: dict[str, Any]) -> Any:
    cfg = Config(device_id="d", data_dir=tmp_path)
    cfg.cameras = [CameraConfig(name="cam", source=str(tmp_path))]
    cfg.line_io = LineIOConfig.model_validate(line_io)
    return next(c for c in Doctor(cfg).run() if c.name == "line i/o")


def opcua(port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    return {"enabled": True, "host": host, "port": port,
            "users": [{"name": "plc", "password_hash": hash_password("x")}]}


def test_no_stations_is_skipped(tmp_path: Path) -> None:
    assert check(tmp_path, {}).status == "skip"


def test_a_station_on_an_unknown_camera_fails(tmp_path: Path) -> None:
    c = check(tmp_path, {"stations": [{**STATION, "camera": "gone"}]})
    assert c.status == "fail" and "st1 -> gone" in c.detail


def test_opcua_without_a_trusted_plc_warns_and_says_how(tmp_path: Path) -> None:
    c = check(tmp_path, {"stations": [STATION], "opcua": opcua(free_port())})
    assert c.status == "warn" and "free" in c.detail and "move the PLC's from rejected/ to trusted/" in c.fix


def test_a_served_endpoint_with_a_trusted_plc_is_ok(tmp_path: Path) -> None:
    (tmp_path / "opcua" / "trusted").mkdir(parents=True)
    (tmp_path / "opcua" / "trusted" / "plc.der").write_bytes(b"x")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        c = check(tmp_path, {"stations": [STATION], "opcua": opcua(port)})
    assert c.status == "ok" and f"opcua 127.0.0.1:{port} served" in c.detail


def test_an_address_of_another_machine_fails(tmp_path: Path) -> None:
    c = check(tmp_path, {"stations": [STATION], "opcua": opcua(4840, host="192.0.2.1")})
    assert c.status == "fail" and "cannot listen there" in c.detail

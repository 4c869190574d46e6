"""`edge-runtime doctor` for line I/O: stations bound to cameras, the OPC UA server's certificate,
trust list and security, and whether each protocol endpoint is served, free, or taken by another
program. Pure reading: nothing here starts a server or writes a file."""

from __future__ import annotations

import datetime as dt
import importlib.util
import socket
from pathlib import Path

from edge_runtime.config import Config

Finding = tuple[str, str, str]  # status (ok | warn | fail | skip), detail, fix


def line_io_findings(config: Config, extra_cameras: set[str] | None = None) -> Finding:
    lio = config.line_io
    if not lio.stations:
        return "skip", "no stations configured", ""
    cameras = {c.name for c in config.cameras} | (extra_cameras or set())
    lost = [f"{s.name} -> {s.camera}" for s in lio.stations if s.camera not in cameras]
    if lost:
        return "fail", f"stations on cameras that are not configured: {', '.join(lost)}", \
            "name a configured camera in line_io.stations[].camera"
    seen = [f"{len(lio.stations)} station(s)"]
    warnings: list[str] = []
    endpoints: list[tuple[str, str, int]] = []
    if lio.opcua.enabled:
        if importlib.util.find_spec("asyncua") is None:
            return "fail", "line_io.opcua is enabled but asyncua is not installed", \
                "pip install 'edge-runtime[lineio]'"
        pki = lio.opcua.pki_dir or config.data_dir / "opcua"
        seen.append(_certificate(pki / "own" / "cert.der"))
        trusted = _count(pki / "trusted")
        seen.append(f"{trusted} trusted client certificate(s)")
        if trusted == 0:
            rejected = _count(pki / "rejected")
            warnings.append(f"no PLC certificate is trusted yet ({rejected} refused one(s) in {pki / 'rejected'}): "
                            f"move the PLC's from rejected/ to trusted/")
        if "none" in lio.opcua.security:
            warnings.append("OPC UA security 'none' is enabled: anyone on the network can trigger and acknowledge")
        endpoints.append(("opcua", lio.opcua.host, lio.opcua.port))
    modbus = getattr(lio, "modbus", None)
    if modbus is not None and modbus.enabled:
        endpoints.append(("modbus", modbus.host, modbus.port))
    for name, host, port in endpoints:
        state = _endpoint(host, port)
        if state == "unusable":
            return "fail", f"{name} {host}:{port}: cannot listen there and nothing answers", \
                f"set line_io.{name}.host to an address of this device, or free port {port}"
        seen.append(f"{name} {host}:{port} {state}")
    if warnings:
        return "warn", "; ".join(seen), "; ".join(warnings)
    return "ok", "; ".join(seen), ""


def _certificate(path: Path) -> str:
    if not path.exists():
        return "server certificate made at first start"
    try:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        return f"server certificate unreadable ({exc}); it is made again at start"
    days = (cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc)).days
    return f"server certificate valid {days} more days"


def _count(folder: Path) -> int:
    try:
        return sum(1 for p in folder.iterdir() if p.is_file())
    except OSError:
        return 0


def _endpoint(host: str, port: int) -> str:
    """'served' (something answers: the daemon, when it runs), 'free', or 'unusable'."""
    try:
        socket.create_connection((host if host != "0.0.0.0" else "127.0.0.1", port), timeout=1.0).close()
        return "served"
    except OSError:
        pass
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        return "free (the daemon is not serving it now)"
    except OSError:
        return "unusable"

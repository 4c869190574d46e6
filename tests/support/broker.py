"""A real Mosquitto broker on a free loopback port, started and stopped by the tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.mjpeg import free_port

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


class Broker:
    def __init__(self, workdir: Path, password: tuple[str, str] | None = None,
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        """`tls` is (ca, server cert, server key); `password` is (user, secret)."""
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {self.dir}/",
                 "user root", "max_queued_messages 100000", "log_dest stderr", "log_type error"]
        if password:
            pwfile = self.dir / "passwd"
            subprocess.run(["mosquitto_passwd", "-c", "-b", str(pwfile), *password], check=True)
            lines += ["allow_anonymous false", f"password_file {pwfile}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            ca, cert, key = tls
            lines += [f"cafile {ca}", f"certfile {cert}", f"keyfile {key}"]
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> Broker:
        with (self.dir / "broker.log").open("ab") as log:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not start: {(self.dir / 'broker.log').read_text()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

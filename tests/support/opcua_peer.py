"""The independent OPC UA peer: node-opcua (npm) driven through tests/support/opcua_client.js, and
the client certificates the tests trust or not."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from edge_runtime.lineio.opcua.pki import ensure_server_certificate
from tests.support.npm import npm_package

NODE_OPCUA = "node-opcua-client@2.186.4"
SCRIPT = Path(__file__).with_name("opcua_client.js")


def client_certificate(folder: Path, application_uri: str) -> tuple[Path, Path]:
    """A client certificate (PEM) and key naming `application_uri`, made by the same code as the server's."""
    der, key = ensure_server_certificate(folder, application_uri, hostname="plc")
    pem = folder / "client.pem"
    pem.write_bytes(x509.load_der_x509_certificate(der.read_bytes()).public_bytes(serialization.Encoding.PEM))
    return pem, key


def trust(pki_dir: Path, cert: Path) -> None:
    """Put `cert` in the trust list, named after its client's folder (every client's file is client.pem)."""
    (pki_dir / "trusted").mkdir(parents=True, exist_ok=True)
    shutil.copy(cert, pki_dir / "trusted" / f"{cert.parent.name}-{cert.name}")


class NodeClient:
    """One node-opcua client process; `request` waits for its answer, notifications gather in `notes`."""

    def __init__(self, workdir: Path) -> None:
        modules = npm_package(NODE_OPCUA)
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "NODE_PATH": str(modules)}
        self.proc = subprocess.Popen(["node", str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=workdir, bufsize=1)
        self.workdir = workdir
        self.notes: list[dict[str, Any]] = []
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next = 0
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._drain_stderr, daemon=True)]
        for t in self._threads:
            t.start()
        self.wait_note(lambda n: n.get("ready"), timeout=30)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "id" in msg:
                self._answers.put(msg)
            else:
                with self._cond:
                    self.notes.append(msg)
                    self._cond.notify_all()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    def request(self, op: str, timeout: float = 20.0, **fields: Any) -> dict[str, Any]:
        self._next += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._next, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        end = time.monotonic() + timeout
        while True:
            answer = self._answers.get(timeout=max(0.01, end - time.monotonic()))
            if answer["id"] == self._next:
                return answer

    def connect(self, endpoint: str, cert: Path, key: Path, application_uri: str, user: str | None = "plc",
                password: str | None = "secret", mode: str = "SignAndEncrypt", policy: str = "Basic256Sha256",
                max_retry: int = 0) -> dict[str, Any]:
        return self.request("connect", endpoint=endpoint, cert=str(cert), key=str(key), pki=str(self.workdir),
                            applicationUri=application_uri, user=user, password=password, mode=mode,
                            policy=policy, maxRetry=max_retry, timeout=30)

    def wait_note(self, pred: Any, timeout: float = 10.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for note in self.notes:
                    if pred(note):
                        return note
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such notification from the OPC UA client in {timeout} s")
                self._cond.wait(left)

    def close(self) -> None:
        try:
            self.request("close", timeout=5)
        except Exception:  # noqa: BLE001 - the client may be gone already
            pass
        self.proc.kill()
        self.proc.wait(5)
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

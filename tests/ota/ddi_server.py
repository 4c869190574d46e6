"""A recorded DDI server for the unit tests: answers shaped exactly like hawkBit's documented examples
(DdiControllerBase, DdiDeploymentBase, DdiCancel), served by a real local http.server, with hostile
modes (oversized, malformed, redirect loop, slow drip) and a record of every request it got, and the
status entries hawkBit would keep for each action from them (`history`).

Like hawkBit (and goosebit), an action whose closing feedback the server took (or answered 410 Gone, already
closed) is no longer offered: the controller base is served without its deploymentBase link. hawkBit never offers
it again; goosebit, whose action id is its software's, offers the same id again when told to (a failed release
forced again, a release assigned again after a rollback): `reopen`. `closes = False` is a server that offers what
its routes say whatever the device answered."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

TENANT, CONTROLLER = "DEFAULT", "press-7"
_OF_ACTION = re.compile(r"/deploymentBase/([^/]+)(/feedback)?$")
_BASE = re.compile(r"^/[^/]+/controller/v1/[^/]+$")
_OFFERED = re.compile(r"/deploymentBase/([^/?#]+)")
_ARTIFACT = re.compile(r"/softwaremodules/[^/]+/artifacts/")


def controller_base(base: str, sleep: str = "00:00:01", deployment: str | None = None, cancel: str | None = None,
                    config_data: bool = False) -> dict[str, Any]:
    """hawkBit's DdiControllerBase example, with the links this test wants."""
    links: dict[str, Any] = {}
    if deployment is not None:
        links["deploymentBase"] = {"href": f"{base}/deploymentBase/{deployment}?c=-2127183556"}
    if cancel is not None:
        links["cancelAction"] = {"href": f"{base}/cancelAction/{cancel}"}
    if config_data:
        links["configData"] = {"href": f"{base}/configData"}
    return {"config": {"polling": {"sleep": sleep}}, "_links": links}


def deployment_base(server: str, action: str, artifact: bytes, filename: str = "manifest.signed.json",
                    update: str = "forced", size: int | None = None) -> dict[str, Any]:
    """hawkBit's DdiDeploymentBase example (one chunk, one artifact) with our manifest as the artifact."""
    url = f"{server}/{TENANT}/controller/v1/{CONTROLLER}/softwaremodules/23/artifacts/{filename}"
    return {
        "id": action,
        "deployment": {
            "download": "forced", "update": update, "maintenanceWindow": "available",
            "chunks": [{
                "part": "bApp", "version": "2.0.0", "name": "edge-runtime",
                "artifacts": [{
                    "filename": filename,
                    "hashes": {"sha1": hashlib.sha1(artifact).hexdigest(), "md5": hashlib.md5(artifact).hexdigest(),
                               "sha256": hashlib.sha256(artifact).hexdigest()},
                    "size": len(artifact) if size is None else size,
                    "_links": {"download": {"href": url}, "download-http": {"href": url},
                               "md5sum-http": {"href": url + ".MD5SUM"}}}],
                "metadata": [{"key": "aMetadataKey", "value": "Metadata value as defined in software module"}]}]},
        "actionHistory": {"status": "RUNNING", "messages": ["Assignment initiated by user 'TestPrincipal'"]}}


@dataclass
class Recorded:
    """What the server answers (path -> (status, body bytes, headers)) and what it was sent."""

    routes: dict[str, tuple[int, bytes, dict[str, str]]] = field(default_factory=dict)
    drip_s: float = 0.0  # > 0: send the body one byte per drip_s
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    # action id -> the status entries hawkBit keeps for it (its action history, at most 1000 by default:
    # `maxStatusEntriesPerAction`): one per feedback it accepted, "execution: details"; RETRIEVED for a
    # GET of the action's deploymentBase unless the last entry is already RETRIEVED (hawkBit's
    # JpaControllerManagement.handleRegisterRetrieved: a device polling the same action adds one, not one a poll);
    # DOWNLOAD for each download of an artifact (DdiRootController.logDownload; here: of the last action fetched).
    history: dict[str, list[str]] = field(default_factory=dict)
    _fetched: str | None = None
    # The actions closed by a feedback the server took (or answered 410): no longer offered while `closes`.
    closed: set[str] = field(default_factory=set)
    closes: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reopen(self, action: str) -> None:
        """Offer `action` again after it was closed, under the same id, as goosebit does (its action id is the
        software's): a failed release with force_update, a release assigned again after a rollback."""
        with self.lock:
            self.closed.discard(action)

    def offered(self, path: str, status: int, payload: bytes) -> bytes:
        """The answer to a GET of `path`: a controller base without the deploymentBase of a closed action."""
        if not self.closes or not self.closed or status != 200 or not _BASE.match(path):
            return payload
        base = json.loads(payload)
        m = _OFFERED.search(str(base.get("_links", {}).get("deploymentBase", {}).get("href", "")))
        if m is None or m.group(1) not in self.closed:
            return payload
        del base["_links"]["deploymentBase"]
        return json.dumps(base).encode()

    def took(self, method: str, path: str, status: int, body: bytes) -> None:
        """Record an action closed by this request, answered with `status`."""
        m = _OF_ACTION.search(path)
        if method == "POST" and m and m.group(2) and (200 <= status < 300 or status == 410):
            if json.loads(body)["status"]["execution"] == "closed":
                self.closed.add(m.group(1))

    def json(self, path: str, value: Any, status: int = 200) -> None:
        self.routes[path] = (status, json.dumps(value).encode(), {"Content-Type": "application/hal+json"})

    def raw(self, path: str, body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.routes[path] = (status, body, headers or {"Content-Type": "application/octet-stream"})

    def feedbacks(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(b) for m, p, _h, b in self.requests if m == "POST" and p.endswith("/feedback")]

    def entered(self, method: str, path: str, status: int, body: bytes) -> None:
        """What hawkBit adds to an action's history for this request, answered with `status`."""
        m = _OF_ACTION.search(path)
        if not 200 <= status < 300 or (method == "GET" and path not in self.routes):
            return
        if m is None:
            if method == "GET" and _ARTIFACT.search(path) and self._fetched is not None:
                self.history[self._fetched].append("DOWNLOAD")
            return
        entries = self.history.setdefault(m.group(1), [])
        if method == "GET" and not m.group(2):
            self._fetched = m.group(1)
            if entries[-1:] != ["RETRIEVED"]:
                entries.append("RETRIEVED")
        elif method == "POST" and m.group(2):
            told = json.loads(body)["status"]
            entries.append(f"{told['execution']}: {'; '.join(told.get('details') or [])}")

    def sent(self, method: str, suffix: str) -> list[tuple[str, str, dict[str, str], bytes]]:
        with self.lock:
            return [r for r in self.requests if r[0] == method and r[1].split("?")[0].endswith(suffix)]


@contextmanager
def ddi_server(recorded: Recorded) -> Iterator[str]:
    """Serves `recorded` on 127.0.0.1; yields the base URL (http://127.0.0.1:PORT)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20)) if length else b""
            with recorded.lock:
                recorded.requests.append((self.command, self.path, dict(self.headers), body))
            status, payload, headers = recorded.routes.get(self.path.split("?")[0], (200, b"{}", {}))
            if self.command in ("POST", "PUT") and self.path.split("?")[0] not in recorded.routes:
                status, payload, headers = 200, b"", {}
            with recorded.lock:
                recorded.entered(self.command, self.path.split("?")[0], status, body)
                recorded.took(self.command, self.path.split("?")[0], status, body)
                if self.command == "GET":
                    payload = recorded.offered(self.path.split("?")[0], status, payload)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if recorded.drip_s:
                for i in range(len(payload)):
                    self.wfile.write(payload[i:i + 1])
                    self.wfile.flush()
                    time.sleep(recorded.drip_s)
            else:
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

"""`api.auth: all`: every route but health probes and the page shell needs the token, reads included
(evidence images, metrics, events); the status page still works in a real Chromium after sign-in."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from flask.testing import FlaskClient

from edge_runtime.api.auth import OPEN_ENDPOINTS, SESSION_COOKIE, session_value
from edge_runtime.app.daemon import Daemon
from edge_runtime.core.samples import write_sample_video
from tests.support.browser import chromium
from tests.support.file_daemon import daemon_from_file
from tests.support.flask_json import json_of
from tests.support.waiting import wait_for

TOKEN = "floor-7-token"
# The exemptions, as paths: health probes and what a browser loads before it can ask for the token.
OPEN_PATHS = {"/healthz", "/readyz", "/", "/static/{name}"}


def write_config(path: Path, tmp: Path, demo_dir: Path, auth: str) -> None:
    video = tmp / "v.avi"
    if not video.exists():
        write_sample_video(video, frames=60)
    path.write_text(f"device_id: locked\ndata_dir: {tmp / 'data'}\nmodel:\n  path: {demo_dir}\n  threads: 2\n"
                    f"api:\n  host: 127.0.0.1\n  port: 0\n  token: {TOKEN}\n  auth: {auth}\n"
                    "mqtt:\n  enabled: false\nevidence:\n  keep_passes: 1.0\n"
                    f"cameras:\n  - name: belt\n    source: {video}\n    fps: 10\n    trigger: {{mode: on_demand}}\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("readauth")
    path = tmp / "edge.yaml"
    write_config(path, tmp, demo_dir, "all")
    with daemon_from_file(path) as started:
        d = started.daemon
        wait_for(lambda: d.rigs["belt"].camera.slot.peek() is not None, 10, "a frame")
        d.entry.trigger("belt").result(timeout=30)
        yield d


@pytest.fixture
def result_id(daemon: Daemon) -> str:
    assert daemon.api is not None
    client = daemon.api.app.test_client()
    rows = json_of(client.get("/api/v1/inspections?limit=20", headers={"Authorization": f"Bearer {TOKEN}"}))
    with_image = [r for r in rows["results"] if r.get("evidence")]
    assert with_image, rows
    return str(with_image[0]["id"])


def get_routes(client: FlaskClient, result_id: str) -> list[tuple[str, str]]:
    """Every GET path of the OpenAPI document and of Flask's own route table (so a route left out of
    the document cannot slip through), with real values for its parameters."""
    app = client.application
    with app.test_request_context():
        from edge_runtime.api.openapi import openapi_document
        documented = {p for p, ops in openapi_document()["paths"].items() if "get" in ops}
    routed = {re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", r.rule) for r in app.url_map.iter_rules()
              if "GET" in (r.methods or set())}
    assert routed <= documented, routed - documented
    values = {"result_id": result_id, "name": "belt", "fmt": "csv"}
    out = []
    for path in sorted(documented):
        concrete = "/static/app.js" if path == "/static/{name}" else \
            re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], path)
        out.append((path, concrete))
    return out


def read(client: FlaskClient, path: str, **kw: Any) -> int:
    response = client.get(path, buffered=False, **kw)
    status = response.status_code
    response.close()  # the event stream never ends by itself
    return status


def test_every_get_route_but_the_exemptions_needs_the_token_under_auth_all(daemon: Daemon, result_id: str) -> None:
    assert daemon.api is not None and OPEN_ENDPOINTS
    client = daemon.api.app.test_client()
    routes = get_routes(client, result_id)
    assert len(routes) >= 15, routes
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for template, path in routes:
        expected = 200 if template in OPEN_PATHS else 401
        assert read(client, path) == expected, path
        assert read(client, path, headers={"Authorization": "Bearer wrong"}) == expected, path
        assert read(client, path, headers=bearer) == 200, path


def test_openapi_document_marks_every_operation_but_the_exemptions_as_secured(daemon: Daemon) -> None:
    assert daemon.api is not None
    document = json_of(daemon.api.app.test_client().get("/api/v1/openapi.json",
                                                         headers={"Authorization": f"Bearer {TOKEN}"}))
    assert document["security"] == [{"bearer": []}]
    open_ops = {p for p, ops in document["paths"].items() if all(op.get("security") == [] for op in ops.values())}
    assert open_ops == OPEN_PATHS


def test_writes_default_keeps_reads_open(daemon: Daemon, result_id: str) -> None:
    assert daemon.api is not None
    daemon.api.apply(daemon.config.api.model_copy(update={"auth": "writes"}))
    try:
        client = daemon.api.app.test_client()
        for _, path in get_routes(client, result_id):
            assert read(client, path) == 200, path
    finally:
        daemon.api.apply(daemon.config.api)


def test_session_cookie_opens_reads_but_never_writes(daemon: Daemon, result_id: str) -> None:
    assert daemon.api is not None
    base = f"http://127.0.0.1:{daemon.api.port}"
    assert requests.post(f"{base}/api/v1/session", timeout=5).status_code == 401
    signed = requests.post(f"{base}/api/v1/session", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert signed.status_code == 204
    cookie = signed.cookies[SESSION_COOKIE]
    assert cookie is not None
    set_cookie = signed.headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    jar = {SESSION_COOKIE: cookie}
    image = requests.get(f"{base}/api/v1/results/{result_id}/image.jpg", cookies=jar, timeout=5)
    assert image.status_code == 200 and image.content[:2] == b"\xff\xd8"
    assert requests.get(f"{base}/metrics", cookies=jar, timeout=5).status_code == 200
    # A write with only the cookie is refused: a cross-site form can never act on the device.
    review = requests.post(f"{base}/api/v1/results/{result_id}/review", json={"action": "confirm"},
                           cookies=jar, timeout=5)
    assert review.status_code == 401
    # Forged, expired and other-token cookies are refused.
    for bad in ("1.abc", f"{int(time.time()) + 60}.{'0' * 64}", session_value("other-token", app=daemon.api.app),
                session_value(TOKEN, now=time.time() - 13 * 3600, app=daemon.api.app)):
        assert requests.get(f"{base}/api/v1/status", cookies={SESSION_COOKIE: bad}, timeout=5).status_code == 401


def test_reload_switches_auth_and_a_rotated_token_ends_sessions(daemon: Daemon, tmp_path: Path,
                                                                demo_dir: Path) -> None:
    assert daemon.api is not None and daemon.config_path is not None
    base = f"http://127.0.0.1:{daemon.api.port}"
    path = daemon.config_path
    original = path.read_text()
    jar = {SESSION_COOKIE: session_value(TOKEN, app=daemon.api.app)}
    try:
        path.write_text(original.replace("auth: all", "auth: writes"))
        assert "api.auth" in daemon.reload()["applied"]
        assert requests.get(f"{base}/api/v1/status", timeout=5).status_code == 200
        path.write_text(original.replace(TOKEN, "rotated-token"))
        daemon.reload()
        assert requests.get(f"{base}/api/v1/status", timeout=5).status_code == 401
        assert requests.get(f"{base}/api/v1/status", cookies=jar, timeout=5).status_code == 401
    finally:
        path.write_text(original)
        daemon.reload()


def test_page_loads_status_and_an_evidence_image_after_the_technician_enters_the_token(
        daemon: Daemon, result_id: str) -> None:
    assert daemon.api is not None
    with chromium() as browser:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{daemon.api.port}/")
        page.wait_for_selector("#signin", state="visible", timeout=10_000)
        assert page.text_content("#device") == "edge-runtime"  # nothing read without the token
        page.fill("#signin-token", "wrong")
        page.click("#signin button")
        page.wait_for_selector("#signin-status:has-text('wrong token')", timeout=10_000)
        errors: list[str] = []
        page.fill("#signin-token", TOKEN)
        with page.expect_navigation():
            page.click("#signin button")
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.wait_for_function("document.getElementById('device').textContent === 'locked'", timeout=15_000)
        assert page.is_hidden("#signin")
        # The evidence image of the newest result, opened from the inspections list.
        page.click(f"#insp-list tr[data-id='{result_id}']", timeout=15_000)
        page.wait_for_function("(() => { const i = document.getElementById('insp-image');"
                               " return i.complete && i.naturalWidth > 0; })()", timeout=15_000)
        frame_loaded = "(() => { const i = document.querySelector('[data-camera=\"belt\"] img');" \
                       " return i && i.complete && i.naturalWidth > 0; })()"
        page.wait_for_function(frame_loaded, timeout=15_000)
        page.wait_for_selector("#live:has-text('live')", timeout=15_000)  # the event stream too
        assert errors == [], errors


def non_loopback_address() -> str:
    """This machine's address on its network (the UDP connect sends nothing; it picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address = str(s.getsockname()[0])
    assert not address.startswith("127."), "the test needs a network interface besides loopback"
    return address


def test_without_a_token_auth_all_reads_only_on_the_device_and_the_page_says_so(
        tmp_path: Path, demo_dir: Path) -> None:
    path = tmp_path / "edge.yaml"
    write_config(path, tmp_path, demo_dir, "all")
    text = (path.read_text().replace(f"  token: {TOKEN}\n", "").replace("host: 127.0.0.1", "host: 0.0.0.0")
            .split("cameras:")[0])
    with daemon_from_file(path, text) as started:
        d = started.daemon
        assert d.api is not None
        client = d.api.app.test_client()
        remote = {"REMOTE_ADDR": "192.0.2.77"}
        assert client.get("/api/v1/status", environ_base=remote).status_code == 403
        assert client.get("/healthz", environ_base=remote).status_code == 200
        assert client.get("/api/v1/status").status_code == 200  # the test client is 127.0.0.1
        with chromium() as browser:
            page = browser.new_page()
            page.goto(f"http://{non_loopback_address()}:{d.api.port}/")
            page.wait_for_selector("#banner:has-text('only on itself')", timeout=10_000)
            assert page.text_content("#ready") == "local only" and page.is_hidden("#signin")

"""Remote image URLs on /v1/chat/completions cannot reach the device's own services (review D18).

With `api.allow_remote_image_urls` on, a URL whose host is an address of the device or its link
(loopback, link-local such as the cloud metadata range, the unspecified address, an IPv6 form of a
loopback address, a name that resolves to one) is refused before any connection is made, unless
`api.allow_local_image_urls` says so; a URL with a user name or password is refused; a failed fetch
does not echo the upstream's status or body (which turned the endpoint into a port scanner)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from edge_runtime.core.samples import part_image
from tests.api.test_api import make_daemon
from tests.support.images import encode

FIELD = "messages.0.content.0.image_url.url"
PNG = encode(part_image(1), ".png")


class ImageServer:
    """Serves /ok.png and answers 404 with a telling body elsewhere; counts the requests it saw."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                if self.path == "/ok.png":
                    body, status, kind = PNG, 200, "image/png"
                else:
                    body, status, kind = b"admin console: secret-marker", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def image_server() -> Iterator[ImageServer]:
    server = ImageServer()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("remote-urls"), demo_dir, camera=False)
    d.config.api.allow_remote_image_urls = True
    yield d
    d.stop()


@pytest.fixture
def local_ok(daemon: Daemon) -> Iterator[None]:
    daemon.config.api.allow_local_image_urls = True  # read per request
    yield
    daemon.config.api.allow_local_image_urls = False


def chat(daemon: Daemon, url: str) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{daemon.api.port}/v1/chat/completions", timeout=30,  # type: ignore[union-attr]
                         json={"model": "edge-demo-vlm", "max_tokens": 16, "messages": [{"role": "user", "content": [
                             {"type": "image_url", "image_url": {"url": url}},
                             {"type": "text", "text": "Describe the part."}]}]})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "0.0.0.0", "127.8.9.10"])
def test_a_url_of_the_device_itself_is_refused_without_a_connection(daemon: Daemon, image_server: ImageServer,
                                                                     host: str) -> None:
    before = len(image_server.hits)
    r = chat(daemon, f"http://{host}:{image_server.port}/ok.png")
    error = r.json()["error"]
    assert r.status_code == 400 and FIELD in error["message"]
    assert "destination not allowed" in error["message"] and "api.allow_local_image_urls" in error["message"]
    assert len(image_server.hits) == before


def test_the_link_local_metadata_address_is_refused(daemon: Daemon) -> None:
    r = chat(daemon, "http://169.254.169.254/latest/meta-data/")
    assert r.status_code == 400 and "destination not allowed" in r.json()["error"]["message"]


def test_a_url_with_a_user_name_and_password_is_refused(daemon: Daemon, image_server: ImageServer,
                                                        local_ok: None) -> None:
    before = len(image_server.hits)
    r = chat(daemon, f"http://user:pass@127.0.0.1:{image_server.port}/ok.png")
    assert r.status_code == 400 and "user name or password" in r.json()["error"]["message"]
    assert len(image_server.hits) == before


def test_allowed_local_urls_are_fetched_and_upstream_errors_are_not_echoed(
        daemon: Daemon, image_server: ImageServer, local_ok: None) -> None:
    ok = chat(daemon, f"http://127.0.0.1:{image_server.port}/ok.png")
    assert ok.status_code == 200, ok.text
    failed = chat(daemon, f"http://127.0.0.1:{image_server.port}/admin")
    message = failed.json()["error"]["message"]
    assert failed.status_code == 400 and "the image could not be fetched" in message
    assert "404" not in message and "secret-marker" not in message
    assert "/admin" in image_server.hits  # it was fetched: only the answer is kept from the client

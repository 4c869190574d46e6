"""User-visible consistency of the HTTP API (issue 27 item 8): documented shapes, errors as JSON, Range."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from tests.api.test_api import running_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    yield from running_daemon(tmp_path_factory.mktemp("consistency"), demo_dir, results=1)


@pytest.fixture(scope="module")
def base(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]


def refs(node: Any) -> Iterator[str]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("$ref"), str):
                yield item["$ref"]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def test_every_ref_in_the_openapi_document_resolves(base: str) -> None:
    doc = requests.get(base + "/api/v1/openapi.json", timeout=10).json()
    found = list(refs(doc))
    assert len(found) > 10
    for ref in found:
        assert ref.startswith("#/"), ref
        node: Any = doc
        for part in ref[2:].split("/"):
            assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
            node = node[part]


@pytest.mark.parametrize(("method", "path", "data"), [
    ("POST", "/api/v1/infer", b"x" * (3 * 2**20)),  # past api.max_request_mb (2 in these tests): Flask's 413
    ("POST", "/api/v1/infer", b"x" * (6 * 2**20)),  # past waitress's own bound (2 x limit + 1 MB): its 413
    ("GET", "/static//x", None),
    ("GET", "/api/v1/nothing-here", None),
    ("DELETE", "/api/v1/status", None),
    ("GET", "/api/v1/results/", None),
])
def test_every_error_answer_is_json(base: str, method: str, path: str, data: bytes | None) -> None:
    r = requests.request(method, base + path, data=data, timeout=30, allow_redirects=False,
                         headers={"Content-Type": "application/json"} if data else {})
    assert r.status_code >= 300, r.status_code
    assert r.headers["Content-Type"].startswith("application/json"), (r.status_code, r.headers, r.text[:200])
    assert "message" in r.json()["error"]


def kept_image(base: str, daemon: Daemon) -> str:
    from tests.support.waiting import wait_for

    def found() -> str | None:
        for r in requests.get(base + "/api/v1/results?limit=50", timeout=10).json()["results"]:
            if requests.head(f"{base}/api/v1/results/{r['id']}/image.jpg", timeout=10).status_code == 200:
                return str(r["id"])
        return None
    wait_for(lambda: found() is not None, 30, "a result with kept evidence")
    return str(found())


@pytest.mark.parametrize("name", ["image.jpg", "thumbnail.jpg"])
def test_evidence_images_answer_head_and_single_ranges(base: str, daemon: Daemon, name: str) -> None:
    url = f"{base}/api/v1/results/{kept_image(base, daemon)}/{name}"
    whole = requests.get(url, timeout=10)
    size = len(whole.content)
    assert whole.status_code == 200 and whole.headers["Accept-Ranges"] == "bytes" and size > 100
    assert int(whole.headers["Content-Length"]) == size
    head = requests.head(url, timeout=10)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == size and not head.content
    part = requests.get(url, headers={"Range": "bytes=10-19"}, timeout=10)
    assert part.status_code == 206 and part.content == whole.content[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{size}"
    tail = requests.get(url, headers={"Range": "bytes=-5"}, timeout=10)
    assert tail.status_code == 206 and tail.content == whole.content[-5:]
    past = requests.get(url, headers={"Range": f"bytes={size + 10}-"}, timeout=10)
    assert past.status_code == 416 and past.headers["Content-Range"] == f"bytes */{size}"
    assert past.headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("path", ["/api/v1/results?until=", "/api/v1/results?since=",
                                  "/api/v1/inspections?until=", "/api/v1/inspections?since=%20",
                                  "/api/v1/results?since=yesterday", "/api/v1/results?until=%ED%A0%80"])
def test_an_empty_or_malformed_time_bound_is_a_400_naming_it(base: str, path: str) -> None:
    r = requests.get(base + path, timeout=10)
    name = "until" if "until" in path else "since"
    assert r.status_code == 400 and r.json()["error"]["field"] == name, r.text


@pytest.mark.parametrize("value", ["5.0", "+5", "1_000", "٥", "5x", "9" * 20, "-1", "0x10"])
def test_last_event_id_takes_ascii_digits_only(base: str, value: str) -> None:
    r = requests.get(base + "/api/v1/events", headers={"Last-Event-ID": value.encode().decode("latin-1")},
                     timeout=10, stream=True)
    assert r.status_code == 400 and r.json()["error"]["field"] == "Last-Event-ID", (value, r.status_code)
    r = requests.get(base + "/api/v1/events", params={"last_event_id": value}, timeout=10, stream=True)
    assert r.status_code == 400 and r.json()["error"]["field"] == "last_event_id", (value, r.status_code)


def test_a_plain_last_event_id_opens_the_stream(base: str) -> None:
    with requests.get(base + "/api/v1/events", headers={"Last-Event-ID": "0"}, timeout=10, stream=True) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")

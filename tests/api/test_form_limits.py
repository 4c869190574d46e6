"""A multipart upload over the form parser's own limits (more than 1,000 parts, a text field over
500 kB) is refused with a 413 that says so. It said "the request body is larger than the limit of
N MB" for a body of 1 MB, sending the client to shrink an image that was not the problem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from tests.api.test_api import make_daemon


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[str]:
    d: Daemon = make_daemon(tmp_path_factory.mktemp("form-limits"), demo_dir, camera=False)
    assert d.api is not None
    yield f"http://127.0.0.1:{d.api.port}"
    d.stop()


def multipart(parts: list[tuple[str, bytes]]) -> bytes:
    out = b"".join(b'--xx\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (name.encode(), value)
                   for name, value in parts)
    return out + b"--xx--\r\n"


@pytest.mark.parametrize("parts", [
    [(f"f{i}", b"v") for i in range(1200)],  # ~60 kB of many parts
    [("prompt", b"p" * 600_000)],  # one text field of 600 kB
], ids=["parts", "text-field"])
def test_a_form_over_the_parsers_limits_is_a_413_that_names_them_not_the_body_size(
        url: str, parts: list[tuple[str, bytes]]) -> None:
    body = multipart(parts)
    assert len(body) < 1024 * 1024  # well under api.max_request_mb (2 MB here)
    r = requests.post(f"{url}/api/v1/infer", data=body, timeout=30,
                      headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert r.status_code == 413
    error = r.json()["error"]
    assert "larger than the limit" not in error["message"]
    assert "1000 parts" in error["message"] and "500 kB" in error["message"]
    assert error["field"] == "body"


def test_a_body_over_max_request_mb_still_names_the_size_limit(url: str) -> None:
    body = multipart([("image", b"\0" * (3 * 1024 * 1024))])
    r = requests.post(f"{url}/api/v1/infer", data=body, timeout=30,
                      headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert r.status_code == 413
    assert "larger than the limit of 2 MB" in r.json()["error"]["message"]

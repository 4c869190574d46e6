"""Text from outside must be valid UTF-8: lone surrogates and duplicate JSON keys are 400s naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from tests.api.test_api import running_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    yield from running_daemon(tmp_path_factory.mktemp("utf8"), demo_dir, results=1)


@pytest.fixture(scope="module")
def base(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]


def post(base: str, path: str, raw: bytes) -> requests.Response:
    return requests.post(base + path, data=raw, headers={"Content-Type": "application/json"}, timeout=30)


def a_result(base: str) -> str:
    return str(requests.get(base + "/api/v1/results?limit=1", timeout=10).json()["results"][0]["id"])


def test_a_lone_surrogate_in_a_review_note_is_a_400_naming_note(base: str) -> None:
    r = post(base, f"/api/v1/results/{a_result(base)}/review", rb'{"action":"confirm","note":"\ud800"}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "note"
    assert "UnicodeEncodeError" not in r.text


def test_a_surrogate_in_a_nested_key_or_value_names_its_path(base: str) -> None:
    r = post(base, "/v1/chat/completions", rb'{"model":"x","messages":[{"role":"user","content":"a\udfffb"}]}')
    assert r.status_code == 400 and r.json()["error"]["field"] == "messages.0.content", r.text
    r = post(base, "/api/v1/cameras/belt/trigger", rb'{"\ud800":"x"}')
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"], r.text


def test_a_valid_surrogate_pair_is_ordinary_text(base: str) -> None:
    r = post(base, f"/api/v1/results/{a_result(base)}/review", rb'{"action":"confirm","note":"ok \ud83d\ude00"}')
    assert r.status_code in (200, 201), r.text


def test_a_duplicate_key_is_a_400_naming_the_key(base: str) -> None:
    r = post(base, f"/api/v1/results/{a_result(base)}/review",
             b'{"action":"confirm","action":"correct","note":"x"}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "action" and "more than once" in r.json()["error"]["message"]

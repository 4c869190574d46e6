"""The HTTP API: through Flask's test client and through the real waitress server."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import requests
from flask.testing import FlaskClient

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import part_image, write_sample_video
from edge_runtime.inference.inspector import Inspector
from tests.support.flask_json import json_of
from tests.support.images import encode, png_bomb

JPEG = encode(part_image(3, defect=True), ".jpg")


def make_daemon(tmp_path: Path, demo_dir: Path, token: str | None = None, queue_size: int = 4,
                camera: bool = True) -> Daemon:
    video = write_sample_video(tmp_path / "v.avi", frames=30)
    cfg = Config(device_id="api-test", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.api.max_request_mb = 2
    cfg.inspection.queue_size = queue_size
    if token:
        from pydantic import SecretStr
        cfg.api.token = SecretStr(token)
    cfg.cameras = [CameraConfig(name="belt", source=str(video), fps=20,
                                trigger=TriggerConfig(mode="interval", interval_s=0.3))] if camera else []
    d = Daemon(cfg)
    d.start()
    return d


def running_daemon(tmp: Path, demo_dir: Path, results: int) -> Iterator[Daemon]:
    """A started demo daemon with at least `results` journaled results, stopped afterwards."""
    d = make_daemon(tmp, demo_dir)
    deadline = time.monotonic() + 20
    while d.journal.counts()["total"] < results and time.monotonic() < deadline:
        time.sleep(0.05)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    yield from running_daemon(tmp_path_factory.mktemp("api"), demo_dir, results=2)


def test_health_and_readiness(client: FlaskClient) -> None:
    assert client.get("/healthz").json == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and json_of(ready)["ready"] is True


def test_status_describes_device_cameras_and_model(client: FlaskClient) -> None:
    status = json_of(client.get("/api/v1/status"))
    assert status["device"] == "api-test" and status["ready"] is True
    assert status["model"]["name"] == "edge-demo-vlm"
    assert status["cameras"][0]["name"] == "belt" and status["cameras"][0]["state"] == "streaming"


def test_results_page_and_single_result(client: FlaskClient) -> None:
    page = json_of(client.get("/api/v1/results?limit=1&camera=belt"))
    assert len(page["results"]) == 1 and page["next_before"] is not None
    older = json_of(client.get(f"/api/v1/results?limit=1&before={page['next_before']}"))["results"]
    assert older[0]["journal_seq"] < page["results"][0]["journal_seq"]
    one = client.get(f"/api/v1/results/{page['results'][0]['id']}")
    assert one.status_code == 200 and json_of(one)["camera"] == "belt"
    missing = client.get("/api/v1/results/nope")
    assert missing.status_code == 404 and "no result" in json_of(missing)["error"]["message"]
    assert client.get("/api/v1/results?limit=zero").status_code == 400


def test_latest_frame_is_a_jpeg(client: FlaskClient) -> None:
    frame = client.get("/api/v1/cameras/belt/frame.jpg")
    assert frame.status_code == 200 and frame.mimetype == "image/jpeg" and frame.data[:2] == b"\xff\xd8"
    assert client.get("/api/v1/cameras/none/frame.jpg").status_code == 404


def test_infer_multipart_and_json(client: FlaskClient) -> None:
    from io import BytesIO
    multipart = client.post("/api/v1/infer", data={"image": (BytesIO(JPEG), "p.jpg"), "prompt": "Scratches?"})
    assert multipart.status_code == 200, multipart.json
    assert json_of(multipart)["prompt"] == "Scratches?" and json_of(multipart)["frame"]["width"] == 640
    as_json = client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode()})
    assert as_json.status_code == 200 and "defect" in json_of(as_json)["verdict"]


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"plain text, not a picture", 400, "not an image"),
    (JPEG[: len(JPEG) // 2], 400, "truncated"),
    (png_bomb(), 413, "more than the limit"),
])
def test_bad_uploads_get_documented_errors(client: FlaskClient, body: bytes, status: int, message: str) -> None:
    from io import BytesIO
    response = client.post("/api/v1/infer", data={"image": (BytesIO(body), "x.jpg")})
    assert response.status_code == status and message in json_of(response)["error"]["message"]
    assert client.get("/healthz").status_code == 200


def test_bad_json_body_and_content_type(client: FlaskClient) -> None:
    assert client.post("/api/v1/infer", json={"image": "%%%"}).status_code == 400
    assert client.post("/api/v1/infer", data=b"x", content_type="text/plain").status_code == 415


def test_remote_callers_need_a_token_when_none_is_configured(client: FlaskClient) -> None:
    remote = client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode()},
                         environ_base={"REMOTE_ADDR": "10.20.30.40"})
    assert remote.status_code == 403
    assert client.get("/api/v1/status", environ_base={"REMOTE_ADDR": "10.20.30.40"}).status_code == 200


def test_token_is_required_when_configured(tmp_path: Path, demo_dir: Path) -> None:
    d = make_daemon(tmp_path, demo_dir, token="t0ken-abc")
    try:
        c = d.api.app.test_client()  # type: ignore[union-attr]
        body = {"image": base64.b64encode(JPEG).decode()}
        assert c.post("/api/v1/infer", json=body).status_code == 401
        wrong = c.post("/api/v1/infer", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith("Bearer")
        ok = c.post("/api/v1/infer", json=body, headers={"Authorization": "Bearer t0ken-abc"},
                    environ_base={"REMOTE_ADDR": "10.20.30.40"})
        assert ok.status_code == 200
        assert c.post("/api/v1/cameras/belt/trigger", headers={"Authorization": "Bearer t0ken-abc"}).status_code == 200
    finally:
        d.stop()


def test_full_queue_answers_429_with_retry_after(tmp_path: Path, demo_dir: Path) -> None:
    d = make_daemon(tmp_path, demo_dir, queue_size=1, camera=False)
    release = threading.Event()
    real = d._current_inspector

    class Blocked:  # the language stage hangs until released; everything else is the real inspector
        def __getattr__(self, name: str) -> Any:
            return getattr(real(), name)

        def inspect(self, *a: Any, **k: Any) -> Any:
            release.wait(10)
            return real().inspect(*a, **k)

        def inspect_batch(self, *a: Any, **k: Any) -> Any:
            release.wait(10)
            return real().inspect_batch(*a, **k)

    blocked = Blocked()  # one object: the worker sees its encodings as the current inspector's
    d.worker.get_inspector = lambda: cast(Inspector, blocked)  # the real inspector, slowed down
    try:
        assert d.api is not None
        d.api.app.extensions["edge_runtime_admission"].max_requests = 100  # reach the queue's own bound
        c = d.api.app.test_client()
        body = {"image": base64.b64encode(JPEG).decode()}
        accepted: list[int] = []
        threads: list[threading.Thread] = []
        # Fill every stage: generating, handed over, encoding, then the queue itself.
        while d.inspections.depth < d.inspections.maxsize and len(threads) < 12:
            t = threading.Thread(target=lambda: accepted.append(c.post("/api/v1/infer", json=body).status_code))
            t.start()
            threads.append(t)
            time.sleep(0.3)
        full = c.post("/api/v1/infer", json=body)
        assert full is not None and full.status_code == 429 and full.headers["Retry-After"] == "2"
        assert "queue is full" in json_of(full)["error"]["message"]
        release.set()
        for t in threads:
            t.join(15)
        assert accepted == [200] * len(threads)  # everything accepted was answered
    finally:
        release.set()
        d.stop()


def test_openapi_document_lists_every_endpoint(client: FlaskClient) -> None:
    doc = json_of(client.get("/api/v1/openapi.json"))
    assert doc["openapi"].startswith("3.")
    for path in ("/healthz", "/readyz", "/api/v1/status", "/api/v1/results", "/api/v1/results/{result_id}",
                 "/api/v1/cameras/{name}/frame.jpg", "/api/v1/infer", "/api/v1/cameras/{name}/trigger",
                 "/v1/chat/completions", "/v1/models", "/metrics", "/"):
        assert path in doc["paths"], path
    # Generated from the routes: every route of the app is in the document.
    rules = {r.rule.replace("<", "{").replace(">", "}").replace("path:", "")
             for r in client.application.url_map.iter_rules()}
    assert rules == set(doc["paths"])


def test_metrics_are_prometheus_text(client: FlaskClient) -> None:
    text = client.get("/metrics").get_data(as_text=True)
    for name in ("edge_stage_latency_seconds_bucket", 'edge_camera_frames_total{camera="belt",outcome="dropped"}',
                 'edge_camera_state{camera="belt",state="streaming"} 1.0', "edge_queue_depth", "edge_results_total",
                 "edge_outbox_backlog"):
        assert name in text, name


# ---- the real server ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_url(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.api.port}"  # type: ignore[union-attr]


def test_real_server_serves_status_and_errors_as_json(base_url: str) -> None:
    assert requests.get(f"{base_url}/api/v1/status", timeout=5).json()["device"] == "api-test"
    missing = requests.get(f"{base_url}/no/such/path", timeout=5)
    assert missing.status_code == 404 and missing.headers["Content-Type"] == "application/json"
    assert requests.get(base_url + "/", timeout=5).headers["Content-Type"].startswith("text/html")


def test_real_server_refuses_an_oversized_body_and_stays_up(base_url: str) -> None:
    big = b"\xff\xd8" + b"\0" * (3 * 1024 * 1024)
    r = requests.post(f"{base_url}/api/v1/infer", files={"image": ("big.jpg", big)}, timeout=30)
    assert r.status_code == 413 and "larger than the limit of 2 MB" in r.json()["error"]["message"]
    assert requests.get(f"{base_url}/healthz", timeout=5).status_code == 200


def test_real_server_infer(base_url: str) -> None:
    r = requests.post(f"{base_url}/api/v1/infer", files={"image": ("p.png", encode(part_image(1), ".png"))},
                      timeout=30)
    assert r.status_code == 200 and r.json()["frame"]["height"] == 480


def test_server_sent_events_deliver_new_results(base_url: str) -> None:
    event = None
    with requests.get(f"{base_url}/api/v1/events", stream=True, timeout=30) as stream:
        for line in stream.iter_lines(decode_unicode=True):
            assert isinstance(line, str)  # decode_unicode with the text/event-stream charset
            if line.startswith("data: "):
                event = json.loads(line[6:])
                break
    assert event is not None, "the stream ended without a result event"
    assert event["camera"] == "belt" and event["verdict"]


# ---- OpenAI compatibility with the official client ----------------------------------------------

def data_url() -> str:
    return "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


@pytest.fixture(scope="module")
def openai_client(base_url: str) -> Any:
    from openai import OpenAI
    return OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def test_openai_models(openai_client: Any) -> None:
    assert [m.id for m in openai_client.models.list()] == ["edge-demo-vlm"]


def test_openai_chat_with_image_and_json_schema(openai_client: Any) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "count"], "additionalProperties": False}
    reply = openai_client.chat.completions.create(
        model="edge-demo-vlm", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "How many bolts are missing?"},
                                               {"type": "image_url", "image_url": {"url": data_url()}}]}],
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": True}})
    parsed = json.loads(reply.choices[0].message.content)
    assert set(parsed) == {"ok", "count"} and 0 <= parsed["count"] <= 9
    assert reply.choices[0].finish_reason == "stop" and reply.usage.prompt_tokens > 49


def test_openai_streaming(openai_client: Any) -> None:
    # A schema whose every answer fits the token budget: the stream must end with "stop" and the
    # concatenated deltas must be the whole JSON document.
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    stream = openai_client.chat.completions.create(
        model="edge-demo-vlm", max_tokens=40, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url()}},
                                               {"type": "text", "text": "Describe the part."}]}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and chunks[-1].choices[0].finish_reason == "stop"
    assert isinstance(json.loads(text)["ok"], bool)


def test_openai_refuses_remote_urls_and_unknown_models(openai_client: Any) -> None:
    import openai
    with pytest.raises(openai.BadRequestError, match="remote image URLs are disabled"):
        openai_client.chat.completions.create(model="edge-demo-vlm", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.invalid/x.jpg"}}]}])
    with pytest.raises(openai.NotFoundError):
        openai_client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])

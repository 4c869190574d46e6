"""The api package against a fake `contracts.Device`: the HTTP layer needs nothing of the daemon but
the interface (no journal, worker, inspector or queue behind it), so any implementation can serve it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from flask.testing import FlaskClient

from edge_runtime.api import ApiServer, create_app
from edge_runtime.config import Config
from edge_runtime.core.device import ChatJob, ChatOutput, DeviceRoles, EvidenceFile, ModelInfo
from edge_runtime.core.errors import QueueFull, UnknownCamera
from edge_runtime.core.result import Result
from edge_runtime.core.result_filter import ResultFilter
from edge_runtime.core.sink import Sink
from tests.verdicts.test_journal import make_result

T = TypeVar("T")
ROW = {"id": "r1", "ts": "2026-11-30T06:00:00Z", "camera": "belt", "journal_seq": 7,
       "verdict": {"defect": False, "category": "ok", "confidence": 0.9}}


class FakeDevice:
    """Every method of `Device`, answering from plain fields; work submissions are refused as full."""

    def __init__(self, tmp: Path, model: ModelInfo | None = None) -> None:
        self._config = Config(device_id="fake", data_dir=tmp)
        self.model = model
        self.queried: list[dict[str, Any]] = []
        self.jpeg = b"\xff\xd8fake-jpeg\xff\xd9"

    @property
    def config(self) -> Config:
        return self._config

    @property
    def started(self) -> float:
        return 1.0

    def status(self) -> dict[str, Any]:
        return {"device": "fake", "cameras": [{"name": "belt"}], "health": self.health()}

    def health(self) -> dict[str, Any]:
        ready = self.model is not None
        return {"ready": ready, "state": "ok" if ready else "starting", "reasons": []}

    def alive(self) -> bool:
        return True

    def camera_names(self) -> list[str]:
        return ["belt"]

    def model_info(self) -> ModelInfo | None:
        return self.model

    def get_result(self, result_id: str) -> dict[str, Any] | None:
        return ROW if result_id == ROW["id"] else None

    def query_results(self, camera: str | None = None, since: str | None = None, until: str | None = None,
                      limit: int = 50, before_seq: int | None = None) -> list[dict[str, Any]]:
        self.queried.append({"camera": camera, "limit": limit, "before_seq": before_seq})
        return [ROW]

    def latest_jpeg(self, camera: str) -> bytes | None:
        if camera != "belt":
            raise UnknownCamera(f"no camera named {camera!r}")
        return self.jpeg

    def trigger(self, camera: str, prompt: str | None = None) -> Future[Result]:
        raise QueueFull("the fake's queue is full")

    def submit_image(self, image: np.ndarray, prompt: str | None = None, camera: str = "api",
                     journal: bool = False) -> Future[Result]:
        raise QueueFull("the fake's queue is full")

    def submit_job(self, job: Callable[[Any], T]) -> Future[T]:
        raise QueueFull("the fake's queue is full")

    def reload(self) -> dict[str, Any]:
        return {"applied": [], "restart_needed": []}

    def constraint(self, schema: dict[str, Any]) -> str:
        return "start: /.*/"

    def chat(self, job: ChatJob) -> Future[ChatOutput]:
        raise QueueFull("the fake's queue is full")

    def verdict_status(self) -> dict[str, Any] | None:
        return None

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        return None

    def query_inspections(self, f: ResultFilter) -> tuple[list[dict[str, Any]], int | None]:
        return [ROW], None

    def iterate_inspections(self, f: ResultFilter) -> Iterator[dict[str, Any]]:
        return iter([ROW])

    def verdict_error(self, verdict: dict[str, Any]) -> tuple[str, str] | None:
        return None

    def review_result(self, result: dict[str, Any], action: str, correction: dict[str, Any] | None,
                      note: str | None) -> dict[str, Any]:
        return {"state": "confirmed"}


def _as_device(fake: FakeDevice) -> DeviceRoles:
    return DeviceRoles.of(fake)  # mypy: the fake implements every role (`Device`) in full


MODEL = ModelInfo("demo", "demo-1", True, 32, 512, {"type": "object"})


@pytest.fixture
def fake(tmp_path: Path) -> FakeDevice:
    return FakeDevice(tmp_path, MODEL)


@pytest.fixture
def client(fake: FakeDevice) -> FlaskClient:
    return create_app(_as_device(fake), fake.config.api).test_client()


def test_health_status_and_readiness_come_from_the_device(client: FlaskClient, fake: FakeDevice) -> None:
    assert client.get("/healthz").json == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json is not None and ready.json["model"] == "demo-1"
    assert client.get("/api/v1/status").json == fake.status()
    fake.model = None
    starting = client.get("/readyz")
    assert starting.status_code == 503 and starting.json is not None and starting.json["model"] is None


def test_results_and_frames_are_read_through_the_device(client: FlaskClient, fake: FakeDevice) -> None:
    page = client.get("/api/v1/results?camera=belt&limit=1").json
    assert page is not None and page["results"] == [ROW] and page["next_before"] == 7
    assert fake.queried == [{"camera": "belt", "limit": 1, "before_seq": None}]
    assert client.get("/api/v1/results/r1").json == ROW
    assert client.get("/api/v1/results/nope").status_code == 404
    frame = client.get("/api/v1/cameras/belt/frame.jpg")
    assert frame.status_code == 200 and frame.data == fake.jpeg
    assert client.get("/api/v1/cameras/gone/frame.jpg").status_code == 404


def test_trigger_refusals_map_to_http_errors(client: FlaskClient) -> None:
    unknown = client.post("/api/v1/cameras/gone/trigger")
    assert unknown.status_code == 404 and unknown.json is not None and unknown.json["error"]["field"] == "name"
    full = client.post("/api/v1/cameras/belt/trigger")
    assert full.status_code == 429 and full.headers["Retry-After"]


def test_chat_goes_through_device_chat_and_models_through_model_info(client: FlaskClient) -> None:
    models = client.get("/v1/models").json
    assert models is not None and [m["id"] for m in models["data"]] == ["demo"]
    full = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                     "response_format": {"type": "json_object"}})
    assert full.status_code == 429


def test_inspections_and_review_use_the_device(client: FlaskClient) -> None:
    rows = client.get("/api/v1/inspections").json
    assert rows is not None and rows["results"] == [ROW]
    assert client.get("/api/v1/inspections/export.jsonl").data.count(b"\n") == 1
    assert client.get("/api/v1/results/r1/image.jpg").status_code == 404  # no evidence kept
    review = client.post("/api/v1/results/r1/review", json={"action": "confirm"})
    assert review.status_code == 200 and review.json is not None and review.json["review"] == {"state": "confirmed"}
    assert client.get("/api/v1/review/schema").json == {"schema": {"type": "object"}, "token_required": False}


def test_the_server_is_a_sink_that_feeds_the_event_stream_and_metrics(fake: FakeDevice) -> None:
    server = ApiServer(_as_device(fake), fake.config.api)
    assert isinstance(server, Sink) and server.health().ok
    _q, backlog = server.events.subscribe(after=0)
    assert backlog == []
    result = make_result("cam")
    server.notify(result)
    _q, backlog = server.events.subscribe(after=0)
    assert [e for e in backlog if result.id in str(e)]
    assert server.metrics.registry.get_sample_value("edge_results_total", {"camera": "cam", "verdict": "ok"}) == 1

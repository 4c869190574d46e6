"""Remote answers the journal cannot keep are never a silent loss (issue 27, item 1).

A REAL HTTP server on 127.0.0.1 answers a valid-looking chat completion with a lone surrogate
(`"\\ud800"` as a JSON escape) in `model`, in the verdict's strings or in a key, or with a duplicate
key that still validates. SQLite cannot encode a lone surrogate as UTF-8: before the fix the frame was
counted in `frames.failed` with no fallback, no log line, the breaker counting a success. Now the
answer is refused as an endpoint failure and the frame is inspected locally; and any other failure to
journal a remote verdict takes the fallback too, counted, logged once and shown degraded."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jsonschema import Draft202012Validator

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, TriggerConfig, parse_config
from edge_runtime.config.offload import EndpointConfig, OffloadConfig
from edge_runtime.core.governor_gate import GateDecision
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.core.result import FrameInfo, Result
from edge_runtime.fleet.offload.client import Endpoint, parse_answer
from edge_runtime.fleet.offload.router import STORE_FAULT, Offloader
from edge_runtime.verdicts.journal import Journal
from tests.support.offload import stand_in_inspector
from tests.support.waiting import wait_for

GOOD = '{"defect": false, "category": "none", "confidence": 0.93, "notes": "surface clean"}'
SCHEMA = {"type": "object", "properties": {"defect": {"type": "boolean"}, "category": {"type": "string"},
                                           "confidence": {"type": "number"}, "notes": {"type": "string"}},
          "required": ["defect"]}


def completion(content: str, model: str = '"big-vlm"', extra: str = "") -> bytes:
    """Written by hand, not json.dumps: the escapes and duplicate keys are what a server sent."""
    return (f'{{{extra}"model": {model}, "choices": [{{"message": {{"role": "assistant", '
            f'"content": {json.dumps(content)}}}}}]}}').encode()


UNSTORABLE = {
    "surrogate in model": completion(GOOD, model='"big-vlm-\\ud800"'),
    "surrogate in a verdict string": completion(GOOD.replace("surface clean", "surface \\ud800 clean")),
    "surrogate in content (outer escape)": completion(GOOD).replace(b"surface clean", b"surface \\ud800 clean"),
    "low surrogate alone": completion(GOOD.replace("surface clean", "\\udfff")),
    "surrogate in a verdict key": completion(GOOD.replace('"notes"', '"n\\udc00"')),
    "surrogate in a body key": completion(GOOD, extra='"x\\ud800": 1, '),
    "duplicate verdict key that validates":
        completion(GOOD.replace('"defect": false', '"defect": false, "defect": true')),
    "duplicate body key": completion(GOOD, extra='"model": "other", '),
    "NaN confidence": completion(GOOD.replace("0.93", "NaN")),
    "infinite confidence": completion(GOOD.replace("0.93", "1e999")),
    "utf-8 encoded surrogate bytes":
        completion(GOOD).replace(b"surface clean", "surface \ud800".encode("utf-8", "surrogatepass")),
}


class Answers:
    """A real HTTP server that answers every chat completion with `body`."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.hits += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_fixtures_are_valid_completions_apart_from_what_they_test() -> None:
    """Lenient json (what the old parser used) reads each body and its verdict, which validates:
    only the strict parser's new checks can refuse them."""
    validator = Draft202012Validator(SCHEMA)
    for body in UNSTORABLE.values():
        outer = json.loads(body)
        verdict = json.loads(outer["choices"][0]["message"]["content"])
        assert validator.is_valid(verdict)
    assert parse_answer(completion(GOOD), validator)[0]["notes"] == "surface clean"
    unicode = completion(GOOD.replace("surface clean", "défaut ✓ 日本"))
    assert parse_answer(unicode, validator)[0]["notes"] == "défaut ✓ 日本"  # real text is welcome


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
def test_an_unstorable_answer_is_an_endpoint_failure_the_breaker_counts(case: str) -> None:
    server = Answers(UNSTORABLE[case])
    try:
        offload = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=server.url, timeout_s=2)],
                                retry={"attempts": 3, "backoff_s": 0.01}, breaker={"failures": 1, "open_s": 60})
        ep = Endpoint(offload.endpoints[0], offload)
        assert ep.ask(b"{}", Draft202012Validator(SCHEMA), threading.Event()) is None
        assert server.hits == 1  # the same answer would come again: not retried
        assert ep.failures == 1 and ep.breaker.state == "open"  # a failure, not a success
        error = ep.last_error or ""
        assert "refused" in error and error.isascii()  # the status page can always show it
    finally:
        server.close()


# ---- the Offloader: a store failure takes the fallback -------------------------------------------


_INSPECTOR = stand_in_inspector(SCHEMA)


def test_a_remote_verdict_the_journal_refuses_is_inspected_locally_counted_logged_and_degraded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The journal refuses two remote results (sqlite3's own error for a failing disk, which the
    journal passes on: it is not a full disk); each frame is inspected locally and journaled."""
    server = Answers(completion(GOOD))
    journal = Journal(tmp_path / "journal.db")
    poison = [2]  # the first two remote results cannot be stored

    def deliver(request: InspectionRequest, result: Result) -> Result:
        if poison[0] > 0:
            poison[0] -= 1
            raise sqlite3.OperationalError("disk I/O error")
        journal.add(result)
        return result

    def local(request: InspectionRequest) -> Future[Result]:
        future: Future[Result] = Future()
        result = Result(device="dev", camera=request.camera, frame=FrameInfo(request.seq, 32, 32),
                        verdict={"defect": False}, text="{}", model="local", timings_ms={"total": 1}, prompt="p")
        journal.add(result)
        future.set_result(result)
        return future

    faults: list[tuple[str, bool]] = []
    cfg = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=server.url, timeout_s=2)], workers=1)
    off = Offloader(cfg, {"a"}, "dev", lambda: _INSPECTOR, deliver, local, lambda: GateDecision(),
                    lambda reason, active: faults.append((reason, active)))
    off.start()
    try:
        with caplog.at_level(logging.INFO, "edge_runtime.fleet.offload"):
            results = [off.take(InspectionRequest(np.zeros((32, 32, 3), np.uint8), "a", seq=i), "remote").result(10)
                       for i in range(2)]
            assert [r.model for r in results] == ["local", "local"]  # inspected here, not lost
            status = off.status()
            assert status["state"] == "degraded" and status["reasons"] == [STORE_FAULT]
            assert status["store_failures"] == 2 and "OperationalError: disk I/O error" in status["last_store_error"]
            assert status["last_store_error"].encode("utf-8")  # storable and showable itself
            assert status["frames"] == {"taken": 2, "remote": 0, "fallback_local": 2, "dropped": 0, "failed": 0,
                                        "in_flight": 0}
            assert faults == [(STORE_FAULT, True)]
            healed = off.take(InspectionRequest(np.zeros((32, 32, 3), np.uint8), "a", seq=3), "remote").result(10)
        assert healed.source["engine"] == "remote"
        status = off.status()
        assert status["state"] == "ok" and status["reasons"] == [] and status["frames"]["remote"] == 1
        assert faults == [(STORE_FAULT, True), (STORE_FAULT, False)]
        said = [r for r in caplog.records if "could not be stored" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "ERROR"  # two failures, one line (rate-limited)
        assert any("stored again" in r.getMessage() for r in caplog.records)
        engines = sorted(row["source"]["engine"] for row in journal.query(camera="a", limit=100))
        assert engines == ["edge", "edge", "remote"]  # every frame taken is in the journal
    finally:
        off.stop()
        journal.close()
        server.close()


def test_a_second_opinion_the_journal_refuses_is_counted_as_a_failed_second_opinion(tmp_path: Path) -> None:
    """It used to count in frames.failed, which escalations never enter: in_flight went negative."""
    server = Answers(completion(GOOD))

    def deliver(request: InspectionRequest, result: Result) -> Result:
        raise OSError("disk I/O error")

    cfg = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=server.url, timeout_s=2)], workers=1)
    off = Offloader(cfg, set(), "dev", lambda: _INSPECTOR, deliver, lambda r: Future(), lambda: GateDecision())
    off.start()
    try:
        asked = Result(device="dev", camera="a", frame=FrameInfo(1, 32, 32), verdict={"defect": True},
                       text="{}", model="local", timings_ms={"total": 1}, prompt="p")
        with pytest.raises(Exception, match="no second opinion"):
            off.second_opinion(asked, np.zeros((32, 32, 3), np.uint8)).result(10)
        status = off.status()
        assert status["second_opinions"]["failed"] == 1 and status["store_failures"] == 1
        assert status["frames"]["in_flight"] == 0 and status["frames"]["failed"] == 0
        assert status["state"] == "degraded"
    finally:
        off.stop()
        server.close()


# ---- the real daemon: the real journal, the real local model ------------------------------------------


@pytest.fixture
def surrogate_server() -> Iterator[Answers]:
    server = Answers(UNSTORABLE["surrogate in model"])  # the demo schema's strings are enums: model is free
    yield server
    server.close()


def test_a_remote_camera_whose_central_server_answers_lone_surrogates_loses_no_frame(
        tmp_path: Path, demo_dir: Path, video: Path, surrogate_server: Answers,
        caplog: pytest.LogCaptureFixture) -> None:
    text = json.dumps({
        "device_id": "line-1", "data_dir": str(tmp_path / "device"), "model": {"path": str(demo_dir), "threads": 1},
        "api": {"host": "127.0.0.1", "port": 0}, "mqtt": {"enabled": False}, "governor": {"enabled": False},
        "offload": {"enabled": True, "endpoints": [{"url": surrogate_server.url, "timeout_s": 3}],
                    "breaker": {"failures": 2, "open_s": 0.5}}})
    cfg = parse_config(text, "device.yaml")
    cfg.cameras = [CameraConfig(name="line", source=str(video), fps=30, remote=True,
                                trigger=TriggerConfig(mode="interval", interval_s=0.3))]
    daemon = Daemon(cfg)

    def engines() -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in daemon.journal.query(camera="line", limit=100_000):
            counts[row["source"]["engine"]] = counts.get(row["source"]["engine"], 0) + 1
        return counts

    with caplog.at_level(logging.WARNING, "edge_runtime.fleet.offload"):
        daemon.start()
        try:
            wait_for(lambda: engines().get("edge", 0) >= 4, 30, "local results")
            for rig in daemon.rigs.values():
                rig.stop()
            wait_for(lambda: daemon.status()["offload"]["frames"]["in_flight"] == 0, 30, "offload to drain")
            wait_for(lambda: daemon.inspections.depth == 0 and daemon.worker.idle(), 30, "local drain")
            status = daemon.status()
            journaled = engines()
        finally:
            daemon.stop()
    frames = status["offload"]["frames"]
    ep = status["offload"]["endpoints"][0]
    assert frames["failed"] == 0 and frames["dropped"] == 0 and frames["remote"] == 0
    assert frames["taken"] == frames["fallback_local"] >= 4
    assert journaled == {"edge": frames["fallback_local"]}  # 0 lost
    assert ep["failures"] == ep["requests"] >= 2 and ep["opened"] >= 1 and "lone surrogate" in ep["last_error"]
    assert any("circuit is open" in r.getMessage() for r in caplog.records)  # not silent
    json.dumps(status, ensure_ascii=False).encode("utf-8")  # the status page can show all of it


def test_the_store_fault_heals_by_itself_when_no_failure_came_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """E.g. a reload made the camera local again: no remote result will come to clear it."""
    import edge_runtime.fleet.offload.router as router

    server = Answers(completion(GOOD))

    def deliver(request: InspectionRequest, result: Result) -> Result:
        raise OSError("disk I/O error")

    def local(request: InspectionRequest) -> Future[Result]:
        future: Future[Result] = Future()
        future.set_exception(RuntimeError("not inspected in this test"))
        return future

    faults: list[tuple[str, bool]] = []
    cfg = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url=server.url, timeout_s=2)], workers=1)
    off = Offloader(cfg, {"a"}, "dev", lambda: _INSPECTOR, deliver, local, lambda: GateDecision(),
                    lambda reason, active: faults.append((reason, active)))
    off.start()
    try:
        with pytest.raises(RuntimeError):
            off.take(InspectionRequest(np.zeros((32, 32, 3), np.uint8), "a"), "remote").result(10)
        assert off.status()["state"] == "degraded"
        monkeypatch.setattr(router, "STORE_FAULT_QUIET_S", 0.0)
        assert off.status()["state"] == "ok" and faults == [(STORE_FAULT, True), (STORE_FAULT, False)]
        assert off.status()["frames"]["fallback_local"] == 1
    finally:
        off.stop()
        server.close()


def test_a_worker_error_on_every_frame_takes_the_fallback_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        default_prompt = "Is there a defect?"

        @property
        def bundle(self) -> Any:
            raise RuntimeError("the model is being swapped")

    def local(request: InspectionRequest) -> Future[Result]:
        future: Future[Result] = Future()
        future.set_result(Result(device="dev", camera="a", frame=FrameInfo(1, 32, 32), verdict={"defect": False},
                                 text="{}", model="local", timings_ms={"total": 1}, prompt="p"))
        return future

    cfg = OffloadConfig(enabled=True, endpoints=[EndpointConfig(url="http://127.0.0.1:9/v1", timeout_s=1)], workers=1)
    off = Offloader(cfg, {"a"}, "dev", Broken, lambda req, res: res, local, lambda: GateDecision())
    off.start()
    try:
        with caplog.at_level(logging.ERROR, "edge_runtime.fleet.offload"):
            for _ in range(3):
                request = InspectionRequest(np.zeros((32, 32, 3), np.uint8), "a")
                assert off.take(request, "remote").result(10).model == "local"
        status = off.status()
        assert status["worker_errors"] == 3 and status["frames"]["fallback_local"] == 3
        assert len([r for r in caplog.records if "worker error" in r.getMessage()]) == 1
    finally:
        off.stop()

"""Concurrent chat completions over the real HTTP server share the worker's batched decode (issue
28): four clients at once are admitted (no 429 while the batch has room), their sequences run side
by side (the worker's counters say so), a stream among them streams, and every greedy answer is
the one a client alone gets. Real daemon, waitress, llama.cpp on the demo bundle."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import requests

from edge_runtime.app.daemon import Daemon
from edge_runtime.core.inspection_queue import InspectionRequest
from edge_runtime.inference.inspector import Inspector
from tests.api.test_api import make_daemon

SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["defect", "category", "notes"],
    "properties": {"defect": {"type": "boolean"},
                   "category": {"type": "string", "enum": ["none", "scratch", "dent", "crack", "stain"]},
                   "notes": {"type": "string", "maxLength": 60}},
}
BODY: dict[str, Any] = {
    "messages": [{"role": "system", "content": "You inspect parts."},
                 {"role": "user", "content": "Is the part scratched? Answer as JSON."}],
    "max_tokens": 96, "temperature": 0,
    "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}},
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("chat"), demo_dir, camera=False)  # the default api and batch settings
    yield d
    d.stop()


def _waiting_chats(d: Daemon) -> int:
    """Chats handed from the encoder stage to the generator: what the running batch can take in."""
    return sum(isinstance(r, InspectionRequest) and r.chat is not None for r, _ in list(d.worker._handoff.queue))


class _HeldFirstBatch:
    """The real inspector, whose first batch starts only once three more chats wait, handed over,
    behind it: the four clients are then in flight together whatever the machine's timing."""

    def __init__(self, d: Daemon, real: Inspector) -> None:
        self.d, self.real, self.held = d, real, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def serve(self, *args: Any, **kwargs: Any) -> Any:
        if not self.held:
            self.held = True
            deadline = time.monotonic() + 20
            while _waiting_chats(self.d) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.real.serve(*args, **kwargs)


def _post(base: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{base}/v1/chat/completions", json=body, timeout=60, stream=bool(body.get("stream")))


def _streamed_text(response: requests.Response) -> tuple[str, str | None]:
    text, finish = "", None
    for line in response.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        assert "error" not in event, event
        choice = event["choices"][0]
        text += choice["delta"].get("content", "")
        finish = choice["finish_reason"] or finish
    return text, finish


def test_four_concurrent_chats_are_admitted_and_decoded_in_one_batch(daemon: Daemon) -> None:
    assert daemon.api is not None
    base = f"http://127.0.0.1:{daemon.api.port}"
    alone = _post(base, BODY)
    assert alone.status_code == 200
    expected = alone.json()["choices"][0]["message"]["content"]
    json.loads(expected)  # schema-constrained: valid JSON

    real = daemon._current_inspector()
    held = _HeldFirstBatch(daemon, real)
    daemon.worker.get_inspector = lambda: cast(Inspector, held)
    batches0 = daemon.worker.batches
    answers: dict[int, tuple[int, str, str | None]] = {}

    def client(i: int) -> None:
        body = {**BODY, "stream": i == 3}
        r = _post(base, body)
        if r.status_code != 200:
            answers[i] = (r.status_code, r.text, None)
        elif body["stream"]:
            answers[i] = (200, *_streamed_text(r))
        else:
            choice = r.json()["choices"][0]
            answers[i] = (200, choice["message"]["content"], choice["finish_reason"])

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        daemon.worker.get_inspector = daemon._current_inspector
    assert [answers[i][0] for i in range(4)] == [200] * 4, answers  # no 429: the batch had room for all four
    assert all(answers[i][1] == expected and answers[i][2] == "stop" for i in range(4)), (expected, answers)
    assert daemon.worker.batches > batches0
    # All four sequences in one decode. How many joined mid-decode rather than starting with the first
    # depends on when the encoder handed them over (CI saw 1 and 3): joining is tests/inference's subject.
    assert daemon.worker.peak_batch == 4


def test_the_default_admission_takes_as_many_inference_requests_as_the_batch_holds(daemon: Daemon) -> None:
    assert daemon.api is not None
    assert daemon.config.api.threads == 6  # the default
    gate = daemon.api.app.extensions["edge_runtime_admission"]
    assert gate.max_requests == daemon.config.inspection.max_batch == 4

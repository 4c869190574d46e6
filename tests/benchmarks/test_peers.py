"""benchmarks/peers.py without the peer (no CI time for building llama-server): its client, routes and
table against a real daemon on a tiny GGUF + mmproj bundle, and its 429 handling against a real HTTP
server that refuses first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.tiny_pairs import TinyPair, write_pair_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import itertools

import peers
from peers_lib.client import Client


def test_peers_measures_every_route_of_our_daemon_alone(
        tmp_path: Path, tiny_pairs: Callable[[str], TinyPair], capsys: pytest.CaptureFixture[str]) -> None:
    bundle = write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "bundle")
    out = tmp_path / "peers.json"
    assert peers.main(["--bundle", str(bundle), "--no-peer", "--workload", "image", "--threads", "2",
                       "--clients", "1,2", "--requests", "2", "--streamed", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (workload,) = report["workloads"]
    routes = {r["route"]: r for r in workload["routes"]}
    assert set(routes) == {"chat", "infer", "camera"}  # OpenAI chat, the upload route, camera triggers
    for r in routes.values():
        assert r["server"] == "edge-runtime"
        # warm-up not counted: 2 sequential + 2 at each of the two levels, every one a schema-valid verdict
        assert (r["valid"], r["total"]) == (6, 6), r["errors"]
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p95"]
        assert set(r["levels"]) == {"1", "2"} and all(v["verdicts_per_s"] > 0 for v in r["levels"].values())
        assert r["peak_rss_mb"] > 50  # the daemon process's VmHWM, not the benchmark's
    chat = routes["chat"]
    assert chat["tokens_per_verdict"] > 0 and chat["ttft_ms_p50"] > 0  # usage and the streamed first delta
    assert chat["levels"]["2"]["tok_s"] > 0
    # our Result JSON carries no token count: the verdict's text re-tokenized with the bundle's vocabulary
    assert routes["infer"]["tokens_per_verdict"] > 0 and routes["camera"]["tokens_per_verdict"] > 0
    assert {"decode", "total", "outside"} <= set(routes["camera"]["stages_ms"]) <= set(routes["infer"]["stages_ms"])
    assert workload["peer_note"] == "peer skipped (--no-peer)" and workload["ratios_ours_over_peer"] == {}
    printed = capsys.readouterr().out
    assert "| edge-runtime · camera |" in printed and "6/6" in printed
    assert "| camera |" in printed and "outside p50" in printed  # the stage table, a row per route


def test_table_puts_ours_over_peer_in_ratio_rows() -> None:
    def report(server: str, p50: float, vps: float) -> peers.RouteReport:
        return peers.RouteReport(server, "chat", tokens_per_verdict=40.0, latency_ms={"p50": p50, "p95": p50},
                                 levels={"4": {"verdicts_per_s": vps, "tok_s": vps * 40}}, valid=8, total=8)

    ours, peer = report("edge-runtime", 500.0, 3.0), report("llama-server", 1000.0, 2.0)
    q = peers.ratios(ours, peer)
    assert q["latency_p50"] == 0.5 and q["verdicts_per_s@4"] == 1.5 and q["tok_s@4"] == 1.5
    table = peers.render("chat", [ours, peer], [4])
    assert "| **ours/peer** · chat | 1.00 | 0.50 | 0.50 | — | 1.50 | 1.50 | 1.00 |" in table


@pytest.mark.parametrize(("text", "valid"), [
    ('{"defect": true, "category": "dent", "notes": "seam"}', True),
    ('{"defect": true, "category": "dent", "notes": "seam"}\n\n\n  ', True),  # whitespace after it is JSON
    ('{"defect": true, "category": "dent", "notes": "seam"', False),  # cut off at max_tokens
    ('{"defect": true, "category": "bent", "notes": "seam"}', False),  # not in the enum
    ('{"defect": true, "category": "dent", "notes": "a\tb"}', False),  # a raw control character
    ('{"defect": NaN, "category": "dent", "notes": "x"}', False),  # not strict JSON
    ('{"defect": true, "category": "dent", "notes": "' + "x" * 61 + '"}', False),  # over maxLength
])
def test_strict_verdict_is_strict_json_valid_against_the_schema(text: str, valid: bool) -> None:
    assert peers.strict_verdict(text, peers.CHAT_SCHEMA) is valid


@pytest.fixture
def refusing_server() -> Iterator[tuple[str, list[float]]]:
    """Answers 429 with Retry-After: 0.3 twice, then 200; records when each request came."""
    seen: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(time.monotonic())
            if len(seen) <= 2:
                body, status, extra = b'{"error": {"code": "busy"}}', 429, {"Retry-After": "0.3"}
            else:
                body, status, extra = json.dumps({"choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
                                                  "usage": {"completion_tokens": 3}}).encode(), 200, {}
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(body)), **extra}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_client_waits_retry_after_on_429_as_the_openai_sdk(refusing_server: tuple[str, list[float]]) -> None:
    base, seen = refusing_server
    client = Client(base, timeout_s=10, max_retries=5)
    try:
        reply = client.chat({"messages": [{"role": "user", "content": "x"}]})
    finally:
        client.close()
    assert (reply.status, reply.retries, reply.completion_tokens, reply.finish_reason) == (200, 2, 3, "stop")
    assert len(seen) == 3 and all(b - a >= 0.29 for a, b in itertools.pairwise(seen))


def test_client_gives_up_after_max_retries(refusing_server: tuple[str, list[float]]) -> None:
    base, seen = refusing_server
    client = Client(base, timeout_s=10, max_retries=1)
    try:
        reply = client.chat({"messages": [{"role": "user", "content": "x"}]})
    finally:
        client.close()
    assert (reply.status, reply.retries, len(seen)) == (429, 1, 2) and "busy" in (reply.error or "")


def test_image_requests_carry_the_next_distinct_part_as_a_camera_would() -> None:
    frames = peers.sample_frames(4)
    assert len(set(frames.jpegs)) == 4  # four different JPEGs: no prompt cache may answer a repeat
    sent: list[str] = []

    class Recorder:
        def chat(self, body: dict[str, object]) -> None:
            (image, _text) = body["messages"][1]["content"]  # type: ignore[index]
            sent.append(image["image_url"]["url"])

    route = peers.chat_routes("edge-runtime", "system", "prompt", peers.CHAT_SCHEMA, 16, frames)
    for _ in range(8):
        route.send(Recorder(), 0)
    assert len(set(sent)) == 4 and sent[:4] == sent[4:]  # each part in turn, then round again
    assert peers.sample_frames(1).jpegs == frames.jpegs[:1]  # --same-image: the first part every time


def test_table_names_the_errors_behind_a_row_of_invalid_answers() -> None:
    failed = peers.RouteReport("llama-server", "chat", valid=0, total=40,
                               errors=["400: Failed to initialize samplers: std::exception"] * 5)
    table = peers.render("image", [failed], [1])
    assert ("llama-server · chat: 40 of 40 not valid; first errors: 400: Failed to initialize samplers: "
            "std::exception") in table


def test_session_pids_include_the_children_a_server_process_starts() -> None:
    """vLLM's engine runs in a child of the API server: its GPU memory is found through the session
    the server was started in (start_new_session), the child's pid included."""
    from peers_lib.servers import session_pids

    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
                               "print(c.pid, flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        found = session_pids(leader.pid)
        assert {leader.pid, child} <= found and outsider.pid not in found
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        outsider.kill()
        leader.wait()
        outsider.wait()
        assert leader.stdout is not None
        leader.stdout.close()


def test_request_i_of_every_route_carries_part_i_whether_or_not_the_route_streams() -> None:
    frames = peers.sample_frames(64)
    sent: dict[str, list[int]] = {}

    def route(name: str, streams: bool) -> peers.Route:
        parts = frames.turn()
        sent[name] = []

        def send(_client: object, _index: int) -> object:
            sent[name].append(parts.take())
            return peers.Reply(200, 0.01, text="{}", finish_reason="stop")
        stream = (lambda c: send(c, 0)) if streams else None
        return peers.Route("edge-runtime", name, send, {}, stream, "http://127.0.0.1:9", parts)

    for r in (route("chat", True), route("camera", False)):
        peers.run_route(r, [1, 2], requests=3, streamed=2, timeout_s=5, progress=lambda _m: None)
    # warm-up part 0, sequential 1-3, chat's streamed 4-5, then both levels from part 6 on every route
    assert sent["chat"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert sent["camera"] == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]

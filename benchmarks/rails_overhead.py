"""What the rails cost per request: 20 rails (10 input, 10 output) that do not fire, the common case.

Two figures: the rails alone (input, image header and output checks on a typical chat request, no
Flask), and a whole `/v1/chat/completions` request on a real daemon (demo bundle, Flask test client)
with and without the rails, interleaved so drift hits both alike.

    python benchmarks/rails_overhead.py --iterations 2000 --requests 200
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2

import edge_runtime.inference.engines  # noqa: F401 - onnxruntime, then llama_cpp (see engines.py)
from edge_runtime.api.rails.engine import Rails, ReaskWindow
from edge_runtime.api.rails.request import Answer, RailRequest, TextPart
from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config, RailsConfig
from edge_runtime.core.samples import part_image

WORDS = [f"forbidden{i}" for i in range(50)]
VERDICT = {"type": "object", "properties": {"defect": {"type": "boolean"}, "category": {"type": "string"},
                                            "notes": {"type": "string", "maxLength": 200}},
           "required": ["defect"]}
RAILS: dict[str, Any] = {
    "input": [
        {"name": "text_length", "max_text_chars": 8000},
        {"name": "images", "max_images": 1},
        {"name": "pixels", "max_image_pixels": 4_000_000},
        {"name": "secrets", "regex": r"(?i)pass(word)?\s*[:=]\s*\S+"},
        {"name": "cards", "regex": r"\b(?:\d[ -]?){13,16}\b"},
        {"name": "jailbreak", "regex": r"(?i)ignore (all|previous|your) (rules|instructions)"},
        {"name": "emails", "regex": r"[\w.+-]+@[\w-]+\.[\w.]+"},
        {"name": "abuse", "words": WORDS},
        {"name": "topics", "words": ["stocks", "weather", "election", "lottery"], "action": "rewrite",
         "rewrite": {"system": "Answer only about the part in the picture."}},
        {"name": "integrator", "access": {"token": "tok-integrator", "schemas": ["verdict", "text"]}},
    ],
    "output": [
        {"name": "leak", "regex": r"hunter[0-9]", "action": "filter"},
        {"name": "urls", "regex": r"https?://\S+", "action": "filter"},
        {"name": "phone", "regex": r"\+?\d[\d -]{8,}\d", "action": "filter"},
        {"name": "abuse", "words": WORDS, "action": "filter"},
        {"name": "brands", "words": ["acme", "globex"], "action": "filter"},
        {"name": "scrap", "when": [{"field": "category", "in": ["scrap", "discard"]}]},
        {"name": "unsure", "when": [{"field": "confidence", "lt": 0.05}]},
        {"name": "notes", "when": [{"field": "notes", "regex": "(?i)guard (door|removed)"}]},
        {"name": "shape", "json_schema": VERDICT},
        {"name": "shape2", "json_schema": {"type": "object", "required": ["defect", "category"]}},
    ],
}
TEXT = ("You inspect welded brackets on line 3. Report defects as JSON with defect, category and notes. "
        * 6)
ANSWER = json.dumps({"defect": True, "category": "porosity", "confidence": 0.82,
                     "notes": "two pores near the left seam, about 1 mm each; the seam is otherwise continuous"})


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def rails_alone(iterations: int) -> list[float]:
    rails = Rails(RailsConfig.model_validate(RAILS), ReaskWindow(), lambda *a: None)
    request = RailRequest("bench", [TextPart("messages.0.content", "system", TEXT),
                                    TextPart("messages.1.content.0.text", "user", "Is the weld continuous? " * 4)],
                          1, "edge-demo-vlm", "verdict", None)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        rails.check_input(request)
        rails.check_image((640, 480), "messages.1.content.1.image_url.url", "bench")
        out = rails.check_output(Answer(ANSWER), None, "bench")
        times.append(time.perf_counter() - start)
        assert out.text == ANSWER  # nothing fired: the figure is the cost of looking
    return times


def whole_requests(requests: int) -> tuple[list[float], list[float]]:
    ok, jpeg = cv2.imencode(".jpg", part_image(3, defect=True))
    assert ok
    image = "data:image/jpeg;base64," + base64.b64encode(jpeg.tobytes()).decode()
    # A schema the output rails accept, so every answer passes them (the figure is the cost of looking).
    schema = {"type": "object", "properties": {"defect": {"type": "boolean"},
                                               "category": {"enum": ["porosity", "crack", "none"]},
                                               "notes": {"type": "string", "maxLength": 20}},
              "required": ["defect", "category", "notes"], "additionalProperties": False}
    body = {"model": "edge-demo-vlm", "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}},
            "messages": [{"role": "system", "content": TEXT},
                         {"role": "user", "content": [{"type": "text", "text": "Is the weld continuous?"},
                                                      {"type": "image_url", "image_url": {"url": image}}]}]}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(device_id="rails-bench", data_dir=Path(tmp))
        cfg.mqtt.enabled = False
        cfg.governor.enabled = False
        cfg.model.threads = 2
        cfg.api.host, cfg.api.port = "127.0.0.1", 0
        daemon = Daemon(cfg)
        daemon.start()
        try:
            assert daemon.api is not None
            client = daemon.api.app.test_client()
            with_rails = cfg.model_copy(update={"rails": RailsConfig.model_validate(RAILS)})
            plain: list[float] = []
            railed: list[float] = []
            for i in range(requests * 2 + 10):
                daemon.running.config = with_rails if i % 2 else cfg  # what a reload swaps
                start = time.perf_counter()
                response = client.post("/v1/chat/completions", json=body)
                elapsed = time.perf_counter() - start
                assert response.status_code == 200, response.get_data(as_text=True)[:300]
                if i >= 10:  # the first ones warm caches (prefix, grammar, compiled rails)
                    (railed if i % 2 else plain).append(elapsed)
        finally:
            daemon.stop()
    return plain, railed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    alone = rails_alone(args.iterations)
    print(f"rails alone, 20 rails, none firing: p50 {statistics.median(alone) * 1e6:.0f} us, "
          f"p95 {pct(alone, 0.95) * 1e6:.0f} us ({args.iterations} requests)")
    plain, railed = whole_requests(args.requests)
    p50_plain, p50_railed = statistics.median(plain), statistics.median(railed)
    print(f"whole chat request (demo bundle, 1 image, JSON schema): p50 {p50_plain * 1000:.2f} ms without rails, "
          f"{p50_railed * 1000:.2f} ms with 20 rails: +{(p50_railed - p50_plain) * 1000:.2f} ms "
          f"({args.requests} requests each, interleaved)")


if __name__ == "__main__":
    main()

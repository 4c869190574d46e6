"""Chat completions per second on a real daemon: one client in a row, then concurrent clients (issue 28).

Starts `edge-runtime run` as its own process (no cameras, API on a free loopback port) on a bundle,
sends the same schema-constrained request (`{"defect": boolean, "category": enum of 5, "notes":
string maxLength 60}`, greedy, `max_tokens` 96) first from one client, then from `--clients`
clients at once; a 429 is retried after its Retry-After, as the openai SDK does, and counted.
Prints one JSON line: completion tokens per second of each phase (the last round in full, every
round's pair), the median ratio, p50 latency, how many answers are valid against the schema, 429s,
and the worker's batched generations from /api/v1/status.

    python benchmarks/chat_speed.py --model DIR [--requests 8] [--clients 4] [--rounds 3] [--image]
        [--gpu-layers -1] [--context 4096] [--fast-forward off]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import requests

from edge_runtime.core.samples import part_image

SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["defect", "category", "notes"],
    "properties": {
        "defect": {"type": "boolean"},
        "category": {"type": "string", "enum": ["none", "scratch", "dent", "crack", "stain"]},
        "notes": {"type": "string", "maxLength": 60},
    },
}
SYSTEM = "You are a visual inspection assistant on a factory line. Answer only with JSON."
QUESTION = "Inspect the part. Is there a defect? Give the category and a short note."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(image: bool) -> dict[str, Any]:
    content: Any = QUESTION
    if image:
        jpeg = cv2.imencode(".jpg", part_image(1, 640, 480))[1].tobytes()
        url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
            "max_tokens": 96, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}}


class Client:
    """One client in a row; 429 retried after Retry-After (counted)."""

    def __init__(self, base: str, body: dict[str, Any]) -> None:
        self.base, self.body = base, body
        self.tokens, self.valid, self.refused, self.answers = 0, 0, 0, 0
        self.latencies: list[float] = []

    def run(self, n: int) -> None:
        with requests.Session() as s:
            for _ in range(n):
                t0 = time.perf_counter()
                while True:
                    r = s.post(f"{self.base}/v1/chat/completions", json=self.body, timeout=300)
                    if r.status_code != 429:
                        break
                    self.refused += 1
                    time.sleep(float(r.headers.get("Retry-After", "1")))
                r.raise_for_status()
                self.latencies.append((time.perf_counter() - t0) * 1000)
                out = r.json()
                self.tokens += out["usage"]["completion_tokens"]
                self.answers += 1
                try:
                    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
                    self.valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass


def phase(base: str, body: dict[str, Any], clients: int, per_client: int) -> dict[str, Any]:
    group = [Client(base, body) for _ in range(clients)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=c.run, args=(per_client,)) for c in group]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(c.tokens for c in group)
    latencies = [x for c in group for x in c.latencies]
    return {"clients": clients, "requests": sum(c.answers for c in group), "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "wall_s": round(wall, 2),
            "p50_ms": round(statistics.median(latencies)), "schema_valid": sum(c.valid for c in group),
            "refused_429": sum(c.refused for c in group)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="bundle folder (e.g. from `models bench siglip224-gemma270m`)")
    ap.add_argument("--requests", type=int, default=8, help="requests of the one-client phase")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--per-client", type=int, default=4, help="requests each concurrent client sends")
    ap.add_argument("--threads", type=int, default=2, help="model.threads")
    ap.add_argument("--image", action="store_true", help="send an image_url part with the question")
    ap.add_argument("--rounds", type=int, default=1, help="one-client and concurrent phases, alternated")
    ap.add_argument("--gpu-layers", type=int, default=0, help="model.gpu_layers (-1: all)")
    ap.add_argument("--context", type=int, default=0, help="model.context_size (0: the config's default)")
    ap.add_argument("--fast-forward", choices=("on", "off"), default="on",
                    help="model.fast_forward: forced tokens decoded in the step that samples the next one")
    args = ap.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(f"device_id: chat-speed\ndata_dir: {tmp}\nmqtt:\n  enabled: false\ngovernor:\n  enabled: false\n"
                       f"model:\n  path: {Path(args.model).resolve()}\n  threads: {args.threads}\n"
                       f"  gpu_layers: {args.gpu_layers}\n  fast_forward: {args.fast_forward == 'on'}\n"
                       + (f"  context_size: {args.context}\n" if args.context else "")
                       + f"api:\n  host: 127.0.0.1\n  port: {port}\n")
        log = (Path(tmp) / "daemon.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run"],
                                stdout=subprocess.DEVNULL, stderr=log, env=os.environ.copy())
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                try:
                    if requests.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit((Path(tmp) / "daemon.log").read_text()[-2000:])
                time.sleep(0.5)
            body = _body(args.image)
            phase(base, body, 1, 1)  # warm: the schema's grammar and matchers
            # Rounds alternate the phases, so load from elsewhere on a shared machine hits both alike.
            rounds = [(phase(base, body, 1, args.requests), phase(base, body, args.clients, args.per_client))
                      for _ in range(args.rounds)]
            ratios = sorted(many["tokens_per_s"] / one["tokens_per_s"] for one, many in rounds)
            one, many = rounds[-1]
            worker = requests.get(f"{base}/api/v1/status", timeout=10).json().get("inspection", {})
            print(json.dumps({"model": Path(args.model).name, "image": args.image,
                              "fast_forward": args.fast_forward, "gpu_layers": args.gpu_layers, "one_client": one,
                              "concurrent": many,
                              "concurrent_over_one": round(statistics.median(ratios), 2),
                              "rounds": [[o["tokens_per_s"], m["tokens_per_s"]] for o, m in rounds],
                              "batched_generations": worker.get("batched_generations")}))
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()


if __name__ == "__main__":
    main()

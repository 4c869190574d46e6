"""Schemathesis against the OpenAPI document of a live `edge-runtime run --demo` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fuzz_live_daemon(tmp: Path, examples: int) -> tuple[int, Counter[int], str]:
    """Start the demo daemon (own data dir, free port), fuzz it; (requests, statuses, daemon log)."""
    port = free_port()
    cfg = tmp / "edge.yaml"
    cfg.write_text(f"device_id: fuzz\ndata_dir: {tmp / 'data'}\napi:\n  host: 127.0.0.1\n  port: {port}\n"
                   "mqtt:\n  enabled: false\n")
    log = tmp / "daemon.log"
    bin_dir = Path(sys.executable).parent
    with log.open("wb") as out:
        proc = subprocess.Popen([str(bin_dir / "edge-runtime"), "--config", str(cfg), "run", "--demo"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp / "data")})
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{base}/readyz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return proc.poll() is not None  # died: stop waiting, the assert below says so

    try:
        wait_for(ready, 120, "the demo daemon")
        assert proc.poll() is None, log.read_text()[-2000:]
        # The event stream is left out: a request/response fuzzer would wait for a stream to end;
        # its one input (last_event_id) is covered by the API tests.
        run = subprocess.run(
            [str(bin_dir / "schemathesis"), "run", f"{base}/api/v1/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", str(examples), "--exclude-path", "/api/v1/events", "--request-timeout", "60",
             "--generation-deterministic", "--report", "har", "--report-dir", str(tmp / "report")],
            capture_output=True, text=True, timeout=1800, check=False, cwd=tmp)  # its cache stays in tmp
        (tmp / "schemathesis.out").write_text(run.stdout + run.stderr)
        (har,) = (tmp / "report").glob("*.json")
        entries = json.loads(har.read_text())["log"]["entries"]
        statuses = Counter(int(e["response"]["status"]) for e in entries)
        hostile = hostile_text_pass(base, tmp / "hostile.out")
        return len(entries) + sum(hostile.values()), statuses + hostile, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


SURROGATE = "\\ud800"  # a lone surrogate as a JSON escape: valid JSON, not valid UTF-8 once decoded


def _bodies(schema: dict[str, Any], components: dict[str, Any]) -> list[str]:
    """Raw JSON bodies for one operation: every top-level string-ish property a lone surrogate (also as
    a key), and each property given twice (a duplicate key that could smuggle a second value)."""
    if "$ref" in schema:
        schema = components.get(schema["$ref"].rsplit("/", 1)[-1], {})
    names = list(schema.get("properties", {})) or ["prompt"]
    bodies = ["{" + ", ".join(f'"{n}": "{SURROGATE}"' for n in names) + "}", f'{{"{SURROGATE}": 1}}']
    bodies += [f'{{"{n}": "a", "{n}": "b"}}' for n in names]
    return bodies


def hostile_text_pass(base: str, out: Path) -> Counter[int]:
    """After schemathesis (which sends only valid UTF-8 and unique keys): every JSON body of the OpenAPI
    document with lone surrogates and duplicate keys, the chat and review bodies deeper down, and query
    strings with invalid UTF-8. Each answer must be a 4xx (counted with the rest: none may be >= 500)."""
    doc = requests.get(f"{base}/api/v1/openapi.json", timeout=10).json()
    components = doc.get("components", {}).get("schemas", {})
    results = requests.get(f"{base}/api/v1/results?limit=1", timeout=10).json()
    rid = (results.get("results") or [{}])[0].get("id", "none") if isinstance(results, dict) else "none"
    statuses: Counter[int] = Counter()
    lines = []

    def send(method: str, path: str, body: str | None) -> None:
        r = requests.request(method, f"{base}{path}", data=None if body is None else body.encode(), timeout=60,
                             headers={"Content-Type": "application/json"})
        statuses[r.status_code] += 1
        lines.append(f"{r.status_code} {method} {path} {(body or '')[:80]}")

    for path, ops in doc["paths"].items():
        concrete = path.replace("{result_id}", rid).replace("{id}", rid).replace("{name}", "cam")
        concrete = concrete.replace("{camera}", "cam")
        for method, op in ops.items():
            content = (op.get("requestBody") or {}).get("content", {})
            if "application/json" in content:
                for body in _bodies(content["application/json"].get("schema", {}), components):
                    send(method.upper(), concrete, body)
            if method == "get" and "{" not in concrete and "events" not in concrete:
                send("GET", f"{concrete}?camera=%ED%A0%80&since=%ED%A0%80", None)
    deep = {
        "/v1/chat/completions": [f'{{"messages": [{{"role": "user", "content": "{SURROGATE}"}}]}}',
                                 '{"messages": [{"role": "user", "content": [{"type": "text", "text": "'
                                 + SURROGATE + '"}]}]}',
                                 '{"messages": [{"role": "user", "content": "a", "content": "b"}]}'],
        f"/api/v1/results/{rid}/review": [f'{{"action": "confirm", "note": "{SURROGATE}"}}',
                                          '{"action": "confirm", "action": "correct"}'],
    }
    for path, bodies in deep.items():
        for body in bodies:
            send("POST", path, body)
    out.write_text("\n".join(lines) + "\n")
    return statuses

"""One HTTP client for both servers: OpenAI chat completions (plain and streamed) and our upload route.

It behaves as the openai SDK does on an overloaded server: a 429 (or 503) is retried after the
server's `Retry-After` (seconds, or `retry-after-ms`), else after a jittered exponential backoff, up to
`max_retries` times; every retry is counted. Stdlib only (http.client), one keep-alive connection per
client thread, so a device machine needs nothing installed for it.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

RETRY_STATUSES = (429, 503)


@dataclass
class Reply:
    """One request as the client saw it: seconds from the first send to the last byte (retries included)."""

    status: int
    latency_s: float
    text: str = ""
    completion_tokens: int | None = None
    finish_reason: str | None = None
    ttft_s: float | None = None  # streamed: first content delta
    retries: int = 0
    error: str | None = None
    body: dict[str, Any] = field(default_factory=dict)


class Client:
    """Not thread-safe: one per client thread (each holds its own connection)."""

    def __init__(self, base: str, timeout_s: float = 300, max_retries: int = 10, token: str | None = None) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _send(self, path: str, body: bytes | None, content_type: str, method: str = "POST") -> http.client.HTTPResponse:
        for attempt in range(2):  # a keep-alive connection the server closed meanwhile: once more, fresh
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self.conn.request(method, path, body, {"Content-Type": content_type, **self.headers})
                return self.conn.getresponse()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> Reply:
        """GET `path` (e.g. our status), its JSON in `body`."""
        return self.post(path, None, method="GET")

    def post(self, path: str, body: bytes | None, content_type: str = "application/json", stream: bool = False,
             method: str = "POST") -> Reply:
        t0 = time.perf_counter()
        retries = 0
        while True:
            resp = self._send(path, body, content_type, method)
            if resp.status in RETRY_STATUSES and retries < self.max_retries:
                delay = _retry_delay(resp, retries)
                resp.read()
                retries += 1
                time.sleep(delay)
                continue
            if stream and resp.status == 200:
                reply = _read_stream(resp, t0)
            else:
                raw = resp.read()
                reply = Reply(resp.status, time.perf_counter() - t0)
                try:
                    reply.body = json.loads(raw) if raw else {}
                except ValueError:
                    reply.error = raw[:200].decode(errors="replace")
                if resp.status != 200:
                    reply.error = reply.error or json.dumps(reply.body)[:300]
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            reply.retries = retries
            return reply

    def chat(self, request: dict[str, Any]) -> Reply:
        """POST /v1/chat/completions; the answer's text, tokens and finish reason lifted out."""
        reply = self.post("/v1/chat/completions", json.dumps(request).encode(), stream=bool(request.get("stream")))
        if reply.status == 200 and reply.body and not request.get("stream"):
            choice = (reply.body.get("choices") or [{}])[0]
            reply.text = (choice.get("message") or {}).get("content") or ""
            reply.finish_reason = choice.get("finish_reason")
            reply.completion_tokens = (reply.body.get("usage") or {}).get("completion_tokens")
        return reply

    def infer(self, jpeg: bytes, prompt: str | None = None) -> Reply:
        """POST /api/v1/infer (our inspection path: the camera pipeline on an uploaded image)."""
        boundary = uuid.uuid4().hex
        parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"part.jpg\"\r\n"
                 "Content-Type: image/jpeg\r\n\r\n".encode() + jpeg + b"\r\n"]
        if prompt:
            parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n"
                         f"{prompt}\r\n".encode())
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        reply = self.post("/api/v1/infer", body, f"multipart/form-data; boundary={boundary}")
        if reply.status == 200:
            reply.text = reply.body.get("text", "")
            reply.finish_reason = "stop"
        return reply


def _retry_delay(resp: http.client.HTTPResponse, retries: int) -> float:
    """The openai SDK's rule: the server's Retry-After(-ms) when given and sane, else 0.5 s doubling to 8 s,
    less up to a quarter of jitter."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = resp.getheader(name)
        if value:
            try:
                delay = float(value) * scale
            except ValueError:
                continue
            if 0 <= delay <= 60:
                return delay
    return min(0.5 * 2 ** retries, 8.0) * (1 - 0.25 * random.random())


def _read_stream(resp: http.client.HTTPResponse, t0: float) -> Reply:
    """Server-sent events of chat.completion.chunk objects, until [DONE] or the end of the body."""
    reply = Reply(200, 0.0)
    pieces: list[str] = []
    for raw in resp:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            reply.error = json.dumps(event["error"])[:300]
            continue
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                if reply.ttft_s is None:
                    reply.ttft_s = time.perf_counter() - t0
                pieces.append(content)
            if choice.get("finish_reason"):
                reply.finish_reason = choice["finish_reason"]
        if event.get("usage"):
            reply.completion_tokens = event["usage"].get("completion_tokens")
    resp.read()
    reply.latency_s = time.perf_counter() - t0
    reply.text = "".join(pieces)
    return reply

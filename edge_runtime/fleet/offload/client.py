"""One central endpoint: builds the OpenAI chat request, sends it with retries, validates the answer.

The request is what vLLM and llama.cpp's server accept: the frame as a JPEG data URI, the prompt, and
the bundle's verdict schema as `response_format` json_schema. The answer is bounded in size and
validated against the same schema before anything downstream sees it.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from jsonschema import Draft202012Validator

from edge_runtime.config.offload import EndpointConfig, OffloadConfig
from edge_runtime.core import http, strict_json
from edge_runtime.fleet.offload.breaker import CircuitBreaker

log = logging.getLogger(__name__)
MAX_ANSWER_DEPTH = 64  # a chat completion with a verdict inside is a few levels deep


class RemoteError(Exception):
    """One failed request; `retry` says whether trying again may help (timeouts, 5xx, 429)."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass
class Answer:
    verdict: dict[str, Any]
    text: str
    model: str
    endpoint: str
    latency_ms: float


def encode_jpeg(image: np.ndarray, max_side: int, quality: int) -> bytes:
    """The frame as JPEG, scaled down so its longest side is at most `max_side`."""
    h, w = image.shape[:2]
    scale = max_side / max(h, w)
    if scale < 1:
        image = cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))),
                           interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("the frame could not be encoded as JPEG")
    return buf.tobytes()


def chat_request(jpeg: bytes, prompt: str, schema: dict[str, Any], model: str | None,
                 max_tokens: int) -> dict[str, Any]:
    """An OpenAI chat completion request asking for a schema-valid verdict about one image."""
    uri = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                  {"type": "text", "text": prompt}]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "verdict", "schema": schema, "strict": True}},
    }
    if model:
        body["model"] = model
    return body


def parse_answer(raw: bytes, validator: Draft202012Validator) -> tuple[dict[str, Any], str, str | None]:
    """(verdict, text, model) from a chat completion body; RemoteError (no retry) when unusable.

    Strict JSON on both levels (the body and the verdict in its content): a duplicate key, a lone
    surrogate anywhere (keys included; it cannot be stored as UTF-8, so the journal would refuse the
    result), NaN/Infinity or a number too large for a float are refused like any malformed answer."""
    try:
        body = strict_json.loads(raw, MAX_ANSWER_DEPTH)  # bounded by max_response_kb
        text = body["choices"][0]["message"]["content"]
        if not isinstance(text, str):
            raise TypeError("content is not a string")
        model = body.get("model")
    except strict_json.StrictJsonError as exc:
        raise RemoteError(f"not an OpenAI chat completion ({exc})" if exc.malformed else
                          f"refused answer: {_where(exc)}{exc}", retry=False) from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RemoteError(f"not an OpenAI chat completion ({type(exc).__name__}: {str(exc)[:100]})",
                          retry=False) from None
    try:
        verdict = strict_json.loads(text, MAX_ANSWER_DEPTH)
    except strict_json.StrictJsonError as exc:
        raise RemoteError(f"the answer is not JSON ({exc})" if exc.malformed else
                          f"refused verdict: {_where(exc)}{exc}", retry=False) from None
    error = next(iter(sorted(validator.iter_errors(verdict), key=str)), None)
    if error is not None:
        raise RemoteError(f"the answer does not match the verdict schema: {error.message[:200]}", retry=False)
    return verdict, text, model[:256] if isinstance(model, str) else None


def _where(exc: strict_json.StrictJsonError) -> str:
    return f"{exc.field}: " if exc.field else ""


class Endpoint:
    """A central server with its breaker and counters (requests, failures, latency)."""

    def __init__(self, cfg: EndpointConfig, offload: OffloadConfig) -> None:
        self.cfg = cfg
        self.url = cfg.url.rstrip("/")
        self.retry = offload.retry
        self.max_bytes = offload.max_response_kb * 1024
        self.breaker = CircuitBreaker(offload.breaker.failures, offload.breaker.open_s)
        self._lock = threading.Lock()
        self.requests = 0
        self.failures = 0
        self.latency_ms_sum = 0.0
        self.latency_ms_last: float | None = None
        self.last_error: str | None = None
        self._open_logged = -1e9

    def ask(self, body: bytes, validator: Draft202012Validator, stop: threading.Event) -> Answer | None:
        """Up to `retry.attempts` tries while the breaker allows; None when this endpoint cannot answer."""
        delay = self.retry.backoff_s
        for attempt in range(self.retry.attempts):
            if attempt and stop.wait(min(delay, self.retry.backoff_max_s)):
                return None
            delay *= 2
            if not self.breaker.allow():
                return None
            if stop.is_set():
                self.breaker.release()
                return None
            t0 = time.perf_counter()
            try:
                raw = self._post(body)
                verdict, text, model = parse_answer(raw, validator)
            except Exception as exc:  # noqa: BLE001 - every outcome must reach the breaker (or a probe never ends)
                retry = isinstance(exc, RemoteError) and exc.retry
                self._count(None, str(exc) if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}")
                opened = self.breaker.opened
                self.breaker.failure()
                if self.breaker.opened > opened:  # a refused central server must not be silent
                    self._log_open()
                if not retry:
                    return None
                continue
            latency = (time.perf_counter() - t0) * 1000
            self._count(latency, None)
            closed = self.breaker.closed
            self.breaker.success()
            if self.breaker.closed > closed:
                log.info("offload: %s answers again; its circuit is closed", self.url)
            return Answer(verdict, text, model or self.cfg.model or "unknown", self.url, latency)
        return None

    def _log_open(self) -> None:
        """The first opening, then at most once a minute (a dead server re-opens after every probe)."""
        now = time.monotonic()
        if now - self._open_logged >= 60:
            self._open_logged = now
            log.warning("offload: %s fails (%s); its circuit is open (opened %d times so far)", self.url,
                        self.last_error, self.breaker.opened)

    def _count(self, latency_ms: float | None, error: str | None) -> None:
        with self._lock:
            self.requests += 1
            if error is not None:
                self.failures += 1
                # shown on the status page and /metrics: always valid UTF-8, whatever the server sent
                self.last_error = error[:300].encode("utf-8", "backslashreplace").decode("utf-8")
            else:
                assert latency_ms is not None
                self.latency_ms_sum += latency_ms
                self.latency_ms_last = latency_ms

    def _post(self, body: bytes) -> bytes:
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": "edge-runtime-offload"}
        if self.cfg.api_key is not None:
            headers["Authorization"] = f"Bearer {self.cfg.api_key.get_secret_value()}"
        try:
            # One deadline over the whole request (lookup, connect, send, headers, body): a socket
            # timeout alone restarts with every byte, so a server dripping its headers held a worker
            # (and the camera waiting for it) forever. http(s) only: the config's url pattern.
            resp = http.request("POST", self.url + "/chat/completions", body=body, headers=headers,
                                timeout_s=self.cfg.timeout_s, limit=self.max_bytes)
        except http.HttpFailure as exc:
            raise RemoteError(str(exc), exc.retry) from None
        if len(resp.body) > self.max_bytes:
            raise RemoteError(f"answer larger than {self.max_bytes // 1024} KiB", retry=False)
        return resp.body

    def status(self) -> dict[str, Any]:
        with self._lock:
            ok = self.requests - self.failures
            return {"url": self.url, "model": self.cfg.model, **self.breaker.snapshot(),
                    "requests": self.requests, "failures": self.failures,
                    "latency_ms_last": None if self.latency_ms_last is None else round(self.latency_ms_last, 1),
                    "latency_ms_avg": round(self.latency_ms_sum / ok, 1) if ok else None,
                    "latency_ms_sum": round(self.latency_ms_sum, 1), "last_error": self.last_error}

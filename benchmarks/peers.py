"""Peers side by side (issues 25, 28 and 45): llama-server or vLLM against our daemon on the same model.

Builds (or reuses) `llama-server` from the llama.cpp our llama-cpp-python vendors (peers_lib/build.py),
then runs ONE server at a time on the same GGUF (+ mmproj), the same threads, and drives each with
the same client (peers_lib/client.py: honours 429 + Retry-After as the openai SDK does):

  chat   issue 28's request: text only, `response_format` json_schema {defect: boolean, category: one of 5,
         notes: string of at most 60}, max_tokens 96, temperature 0 (the peer gets the bundle's language GGUF)
  image  an image + the bundle's verdict schema and prompt (a GGUF + mmproj bundle for the peer);
         ours also through /api/v1/infer (the inspection path) and camera triggers (the camera path).
         Every request carries the next of 64 distinct parts, as a camera never sends one frame twice,
         and request i of every route the same part i (each route its own turn through the parts; a
         camera's image file is replaced by the next part before each trigger, CameraParts). Our encoder
         cache is off, else a later route would find the parts an earlier one encoded
         (`--same-image`: one JPEG throughout, on every route and camera, the encoder cache on; llama-server's
         prompt cache then answers without encoding or prefilling the image again)

Per server and route: latency p50/p95 of sequential requests (request in, schema-valid verdict out),
time to first token (streamed), verdicts/s and tokens/s from 1/2/4/8 concurrent clients, tokens per
verdict (our infer and camera results carry no count: their text re-tokenized with the bundle's vocabulary),
the p50 of each stage of our results' `timings_ms` and what is ours outside the model (a second table),
the share of strict-JSON schema-valid verdicts (jsonschema; finish `stop`: the openai SDK's `parse()` refuses
a `length` one; the JSON-valid count whatever the finish beside it), 429 retries, peak RSS (VmHWM) and GPU
memory (nvidia-smi, when there). One table with ratios ours/peer; `--out FILE` writes JSON.

    python benchmarks/peers.py --bundle DIR [--workload chat|image|both] [--threads 2] [--out peers.json]
    python benchmarks/peers.py --bundle DIR --no-peer       # our daemon alone (the smoke test does this)
    python benchmarks/peers.py --bundle DIR --workload image --vllm-model HF_DIR   # vLLM as the peer (issue 45)

vLLM (`--vllm-model`, peers_lib/servers.py VllmServer) serves the Hugging Face checkpoint the GGUF pair was
converted from (bf16); its own processes are one session, whose GPU memory is summed.
"""

from __future__ import annotations

import argparse
import base64
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_lib.client import Client, Reply
from peers_lib.servers import LlamaServer, OurDaemon, Server, VllmServer, bundle_files, read_bundle

CATEGORIES = ["none", "scratch", "dent", "crack", "stain"]
CHAT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["defect", "category", "notes"],
    "properties": {"defect": {"type": "boolean"}, "category": {"enum": CATEGORIES},
                   "notes": {"type": "string", "maxLength": 60}},
}
CHAT_SYSTEM = "You inspect parts on a production line. Answer with one JSON object."
CHAT_PROMPT = ("Inspection log of part 4711: the weld seam shows a thin dark line about 4 mm long near the "
               "left edge; the surface is otherwise clean. Give the verdict.")
CHAT_MAX_TOKENS = 96
PEERS = ("llama-server", "vllm")
# The Makefile builds llama-cpp-python with these (AMX kernels out: these VMs fault on them); the peer too.
_MAKEFILE_CMAKE_ARGS = "-DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__"


@dataclass
class Route:
    """One way of asking one server for a verdict: a function of (client, client index) -> Reply."""

    server: str
    name: str
    send: Callable[[Client, int], Reply]
    schema: dict[str, Any]
    stream: Callable[[Client], Reply] | None = None  # the same request streamed, for time to first token
    base: str = ""  # the server's URL, set when it runs
    parts: Frames | None = None  # the route's own turn through the images (run_route aligns the phases)


@dataclass
class RouteReport:
    server: str
    route: str
    tokens_per_verdict: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    ttft_ms_p50: float | None = None
    levels: dict[str, dict[str, Any]] = field(default_factory=dict)  # clients -> verdicts/s, tok/s, ...
    valid: int = 0
    total: int = 0
    json_valid: int = 0  # schema-valid JSON whatever the finish (a `length` one is cut off for the openai SDK)
    retries_429: int = 0
    errors: list[str] = field(default_factory=list)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    sample_invalid: str | None = None  # the first answer that was not a valid verdict (at most 300 characters)
    peak_rss_mb: float | None = None
    peak_gpu_mib: int | None = None
    load_avg: list[float] = field(default_factory=list)  # 1-minute load before and after: others' work shows
    ready_s: float | None = None  # the server's process start to its health route answering 200
    first_verdict_s: float | None = None  # process start to the first verdict (the first route's warm-up)
    stages_ms: dict[str, float] = field(default_factory=dict)  # p50 of each timings_ms stage (our results)


def strict_verdict(text: str, schema: dict[str, Any]) -> bool:
    """Strict JSON (no NaN/Infinity, no raw control characters, nothing after it) valid against `schema`."""
    import jsonschema

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        value = json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return isinstance(value, dict) and jsonschema.Draft202012Validator(schema).is_valid(value)


def chat_request(system: str, prompt: str, schema: dict[str, Any], max_tokens: int, image_jpeg: bytes | None = None,
                 stream: bool = False) -> dict[str, Any]:
    content: Any = prompt
    if image_jpeg is not None:
        url = "data:image/jpeg;base64," + base64.b64encode(image_jpeg).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": prompt}]
    body: dict[str, Any] = {
        "model": "default", "max_tokens": max_tokens, "temperature": 0, "seed": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "verdict", "strict": True, "schema": schema}},
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


class Frames:
    """The images requests carry, handed out in turn across client threads (one image: always that one)."""

    def __init__(self, jpegs: list[bytes]) -> None:
        self.jpegs = jpegs
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        """The index of the next image (cycling)."""
        with self._lock:
            i = self._next % len(self.jpegs)
            self._next += 1
            return i

    def seek(self, index: int) -> None:
        """The next take() returns `index` (modulo the count)."""
        with self._lock:
            self._next = index

    def turn(self) -> Frames:
        """The same images with a turn of their own: each route starts at the first part."""
        return Frames(self.jpegs)


class CameraParts:
    """Camera triggers that see the parts in turn: before each trigger the camera's image file is replaced
    by the next part and the client waits (not timed) until the camera has read it, i.e. until its
    `captured` count (our status) is 2 past the replace: a read under way at the replace may still
    deliver the old file, the one after it cannot."""

    def __init__(self, files: list[Path], parts: Frames, timeout_s: float = 30) -> None:
        self.files, self.parts, self.timeout_s = files, parts, timeout_s

    def send(self, client: Client, index: int) -> Reply:
        camera = index % len(self.files)
        error = self.show(client, camera, self.parts.jpegs[self.parts.take()])
        return Reply(0, 0.0, error=error) if error else _trigger(client, camera)

    def show(self, client: Client, camera: int, jpeg: bytes) -> str | None:
        """Put `jpeg` in front of camera `camera`; an error line when it was not read in time."""
        path = self.files[camera]
        staged = path.with_suffix(".next")  # not an image suffix; replaced in one step, never half written
        staged.write_bytes(jpeg)
        os.replace(staged, path)
        seen = self._captured(client, camera)
        deadline = time.monotonic() + self.timeout_s
        while seen is not None and time.monotonic() < deadline:
            now = self._captured(client, camera)
            if now is not None and now >= seen + 2:
                return None
            time.sleep(0.01)
        return f"camera cam{camera} did not read its next part within {self.timeout_s:.0f} s"

    @staticmethod
    def _captured(client: Client, camera: int) -> int | None:
        reply = client.get("/api/v1/status")
        cameras = (reply.body.get("cameras") or []) if reply.status == 200 else []
        for cam in cameras:
            if cam.get("name") == f"cam{camera}":
                return int((cam.get("frames") or {}).get("captured", 0))
        return None


# Files a parts camera re-reads per second: it sees a replaced file within ~0.1-0.2 s (not timed), and the
# re-reads (a 640x480 JPEG decode each) cost the timed requests little.
PART_CAMERA_FPS = 10.0


def chat_routes(server: str, system: str, prompt: str, schema: dict[str, Any], max_tokens: int,
                frames: Frames | None = None) -> Route:
    if frames is None:
        plain = chat_request(system, prompt, schema, max_tokens)
        streamed = chat_request(system, prompt, schema, max_tokens, stream=True)
        return Route(server, "chat", lambda c, _i: c.chat(plain), schema, lambda c: c.chat(streamed))
    # Bodies built once per image, so the base64 of a 640x480 JPEG costs no client time per request.
    bodies = [chat_request(system, prompt, schema, max_tokens, j) for j in frames.jpegs]
    stream_bodies = [chat_request(system, prompt, schema, max_tokens, j, stream=True) for j in frames.jpegs]
    return Route(server, "chat", lambda c, _i: c.chat(bodies[frames.take()]), schema,
                 lambda c: c.chat(stream_bodies[frames.take()]), parts=frames)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _account(report: RouteReport, replies: list[Reply], schema: dict[str, Any]) -> list[Reply]:
    """Count validity, retries, errors and finish reasons; return the replies that hold a valid verdict."""
    good = []
    for r in replies:
        report.total += 1
        report.retries_429 += r.retries
        reason = r.finish_reason or ("error" if r.status != 200 else "none")
        report.finish_reasons[reason] = report.finish_reasons.get(reason, 0) + 1
        if r.status != 200 or r.error:
            if len(report.errors) < 5:
                report.errors.append(f"{r.status}: {r.error}")
            continue
        parsed = strict_verdict(r.text, schema)
        report.json_valid += parsed
        if r.finish_reason in ("stop", None) and parsed:
            report.valid += 1
            good.append(r)
        elif report.sample_invalid is None:
            report.sample_invalid = f"finish {r.finish_reason}: {r.text[:300]!r}"
    return good


def run_route(route: Route, levels: list[int], requests: int, streamed: int, timeout_s: float,
              progress: Callable[[str], None]) -> RouteReport:
    """Warm-up, `requests` sequential requests, `streamed` streamed ones, then each concurrency level."""
    report = RouteReport(route.server, route.name)
    client = Client(route.base, timeout_s)

    def seek(index: int) -> None:  # request i of each phase carries the same part on every route
        if route.parts is not None:
            route.parts.seek(index)

    try:
        seek(0)
        warm = route.send(client, 0)  # warm-up: the schema's grammar compiled, caches primed; not counted
        report.first_verdict_s = round(warm.latency_s, 3)  # measure() adds the start to ready
        seq = [route.send(client, 0) for _ in range(requests)]
        _account(report, seq, route.schema)
        report.stages_ms = stage_p50(seq)
        lat = [r.latency_s * 1000 for r in seq if r.status == 200]
        if lat:
            report.latency_ms = {"p50": round(statistics.median(lat), 1), "p95": round(_percentile(lat, 0.95), 1)}
        tokens = [r.completion_tokens for r in seq if r.completion_tokens is not None]
        if tokens:
            report.tokens_per_verdict = round(statistics.fmean(tokens), 1)
        if route.stream is not None and streamed:
            ttft = [r.ttft_s * 1000 for r in (route.stream(client) for _ in range(streamed)) if r.ttft_s is not None]
            report.ttft_ms_p50 = round(statistics.median(ttft), 1) if ttft else None
    finally:
        client.close()
    seek(1 + requests + streamed)  # where a streamed phase ends, whether this route streamed or not
    progress(f"{route.server} {route.name}: sequential p50 {report.latency_ms.get('p50')} ms")
    for n in levels:
        report.levels[str(n)] = _concurrent(route, report, n, max(requests, n), timeout_s)
        progress(f"{route.server} {route.name}: {n} clients {report.levels[str(n)]}")
    return report


def stage_p50(replies: list[Reply]) -> dict[str, float]:
    """p50 per stage of the `timings_ms` our results carry (camera and infer routes; chat replies carry none),
    and of `outside`: the client's latency less the result's `total` (queueing, journal, HTTP: what is not
    the model's)."""
    stages: dict[str, list[float]] = {}
    for r in replies:
        timings = r.body.get("timings_ms") if r.status == 200 and isinstance(r.body, dict) else None
        for stage, ms in (timings or {}).items():
            if isinstance(ms, (int, float)):
                stages.setdefault(stage, []).append(float(ms))
        if timings and isinstance(timings.get("total"), (int, float)):
            stages.setdefault("outside", []).append(r.latency_s * 1000 - float(timings["total"]))
    return {k: round(statistics.median(v), 1) for k, v in stages.items()}


def _concurrent(route: Route, report: RouteReport, clients: int, total: int, timeout_s: float) -> dict[str, Any]:
    """`total` requests from `clients` threads at once (each takes the next until none is left)."""
    replies: list[Reply] = []
    lock = threading.Lock()
    left = [total]

    def worker(index: int) -> None:
        c = Client(route.base, timeout_s)
        try:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                reply = route.send(c, index)
                with lock:
                    replies.append(reply)
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    good = _account(report, replies, route.schema)
    tokens = [r.completion_tokens for r in replies if r.status == 200 and r.completion_tokens is not None]
    return {"requests": total, "wall_s": round(wall, 2), "verdicts_per_s": round(len(good) / wall, 3),
            "tok_s": round(sum(tokens) / wall, 1) if tokens else None,
            "tokens_per_verdict": round(sum(tokens) / len(tokens), 1) if tokens else None,
            "valid": len(good), "retries_429": sum(r.retries for r in replies)}


def measure(server: Server, routes: list[Route], args: argparse.Namespace) -> list[RouteReport]:
    """Start `server`, run every route on it, read its peak memory, stop it."""
    def say(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    say(f"starting {server.name}: {' '.join(server.command())}")
    out = []
    load_before = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    with server:
        ready_s = round(time.perf_counter() - t0, 2)
        say(f"{server.name} ready in {ready_s:.1f} s")
        for route in routes:
            route.base = server.base
            out.append(run_route(route, args.levels, args.requests, args.streamed, args.timeout, say))
        rss, gpu = server.peak_rss_mb(), server.peak_gpu_mib()
    for i, r in enumerate(out):
        r.peak_rss_mb, r.peak_gpu_mib, r.ready_s = rss, gpu, ready_s
        # only the first route's warm-up is the server's first verdict; later routes' are warm-ups alone
        r.first_verdict_s = round(ready_s + r.first_verdict_s, 2) if i == 0 and r.first_verdict_s else None
        r.load_avg = [load_before, round(os.getloadavg()[0], 2)]
    return out


# ---- the table ---------------------------------------------------------------------------------

def _ratio(ours: float | None, peer: float | None) -> float | None:
    return round(ours / peer, 2) if ours is not None and peer else None


def ratios(report: RouteReport, peer: RouteReport) -> dict[str, float | None]:
    """ours/peer: latency and TTFT (below 1 is faster), verdicts/s and tokens/s (above 1 is faster)."""
    out: dict[str, float | None] = {
        "latency_p50": _ratio(report.latency_ms.get("p50"), peer.latency_ms.get("p50")),
        "latency_p95": _ratio(report.latency_ms.get("p95"), peer.latency_ms.get("p95")),
        "ttft_p50": _ratio(report.ttft_ms_p50, peer.ttft_ms_p50),
        "valid_share": _ratio(report.valid / report.total if report.total else None,
                              peer.valid / peer.total if peer.total else None),
    }
    for n, level in report.levels.items():
        theirs = peer.levels.get(n, {})
        out[f"verdicts_per_s@{n}"] = _ratio(level["verdicts_per_s"], theirs.get("verdicts_per_s"))
        out[f"tok_s@{n}"] = _ratio(level["tok_s"], theirs.get("tok_s"))
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def render(workload: str, reports: list[RouteReport], levels: list[int]) -> str:
    """One markdown table: a row per server and route, then ours/peer ratio rows."""
    heads = (["server · route", "tokens/verdict", "p50 ms", "p95 ms", "TTFT ms"]
             + [f"verdicts/s ×{n}" for n in levels] + [f"tok/s ×{n}" for n in levels]
             + ["schema-valid", "429 retries", "peak RSS MB", "GPU MiB", "load before/after"])
    rows = []
    for r in reports:
        rows.append([f"{r.server} · {r.route}", _fmt(r.tokens_per_verdict), _fmt(r.latency_ms.get("p50")),
                     _fmt(r.latency_ms.get("p95")), _fmt(r.ttft_ms_p50)]
                    + [_fmt(r.levels.get(str(n), {}).get("verdicts_per_s")) for n in levels]
                    + [_fmt(r.levels.get(str(n), {}).get("tok_s")) for n in levels]
                    + [f"{r.valid}/{r.total}" + (f" ({r.json_valid} JSON)" if r.json_valid != r.valid else ""),
                       str(r.retries_429), _fmt(r.peak_rss_mb), _fmt(r.peak_gpu_mib),
                       "/".join(f"{x:.1f}" for x in r.load_avg)])
    peer = next((r for r in reports if r.server in PEERS), None)
    if peer is not None:
        for r in reports:
            if r is peer:
                continue
            q = ratios(r, peer)
            rows.append([f"**ours/peer** · {r.route}", _fmt(_ratio(r.tokens_per_verdict, peer.tokens_per_verdict)),
                         _fmt(q["latency_p50"]), _fmt(q["latency_p95"]), _fmt(q["ttft_p50"])]
                        + [_fmt(q.get(f"verdicts_per_s@{n}")) for n in levels]
                        + [_fmt(q.get(f"tok_s@{n}")) for n in levels]
                        + [_fmt(q["valid_share"]), "", _fmt(_ratio(r.peak_rss_mb, peer.peak_rss_mb)),
                           _fmt(_ratio(r.peak_gpu_mib, peer.peak_gpu_mib)), ""])
    lines = [f"workload {workload}", "", "| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    # A row of zeros says nothing of why: name the first refusals (e.g. a peer's grammar that failed).
    lines += [f"\n{r.server} · {r.route}: {r.total - r.valid} of {r.total} not valid; first errors: "
              + "; ".join(sorted(set(r.errors))) for r in reports if r.errors]
    return "\n".join(lines)


# ---- the workloads -----------------------------------------------------------------------------

def sample_jpeg(seed: int = 3, defect: bool = True) -> bytes:
    """A 640x480 part (the same bytes for the same seed on every run)."""
    import cv2

    from edge_runtime.core.samples import part_image

    image = part_image(seed, 640, 480, defect=defect)
    data: bytes = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    return data


def sample_frames(distinct: int) -> Frames:
    """`distinct` different parts, every third with a defect (seed 3, defect, first: the --same-image one)."""
    return Frames([sample_jpeg(3 + i, defect=i % 3 == 0) for i in range(distinct)])


def chat_template_for(manifest: dict[str, Any]) -> str | None:
    """llama.cpp's built-in template matching the bundle's own, for a GGUF that carries none (a base model)."""
    template = str((manifest.get("prompt") or {}).get("template") or "")
    if manifest.get("format") == 2:
        return None  # the GGUF's own template: what `models import` derived ours from
    return "gemma" if "<start_of_turn>" in template else "chatml" if "<|im_start|>" in template else None


def run_workload(workload: str, args: argparse.Namespace, work: Path, peer_bin: Path | None) -> dict[str, Any]:
    manifest = read_bundle(args.bundle)
    language, mmproj = bundle_files(args.bundle)
    image_tokens = (manifest.get("mtmd") or {}).get("image_max_tokens")
    frames = sample_frames(1 if args.same_image else 64)
    jpeg_path = work / "part.jpg"  # the cameras' still frame (--same-image)
    jpeg_path.write_bytes(frames.jpegs[0])
    image: Frames | None
    if workload == "chat":
        system, prompt, schema, max_tokens, image = CHAT_SYSTEM, CHAT_PROMPT, CHAT_SCHEMA, CHAT_MAX_TOKENS, None
    else:
        p = manifest.get("prompt") or {}
        system, prompt = p.get("system") or CHAT_SYSTEM, p.get("default") or CHAT_PROMPT
        schema = manifest["verdict_schema"]
        max_tokens, image = int((manifest.get("generation") or {}).get("max_tokens") or 160), frames
    cameras = max(args.levels) if workload == "image" and "camera" in args.routes else 0
    # Distinct parts: one image file per camera, replaced before each trigger (CameraParts)
    camera_files = [work / f"cam{i}.jpg" for i in range(cameras)]
    for path in camera_files:
        path.write_bytes(frames.jpegs[0])
    extra: dict[str, dict[str, Any]] = {} if args.same_image else {"model": {"encoder_cache_mb": 0}}
    for section, values in args.ours_set.items():
        extra.setdefault(section, {}).update(values)
    ours = OurDaemon(work, args.bundle, args.threads, args.parallel, args.context, cameras=cameras,
                     image=jpeg_path if args.same_image else camera_files,
                     camera_fps=None if args.same_image else PART_CAMERA_FPS,
                     gpu_layers=args.gpu_layers, no_repack=args.no_repack, source=args.ours_src, extra=extra)
    our_routes = [chat_routes("edge-runtime", system, prompt, schema, max_tokens, image and image.turn())]
    if workload == "image":
        count = token_counter(language)
        if "infer" in args.routes:
            infer_parts = frames.turn()
            our_routes.append(Route("edge-runtime", "infer", counted(
                lambda c, _i: c.infer(infer_parts.jpegs[infer_parts.take()]), count), schema, parts=infer_parts))
        if cameras and args.same_image:
            our_routes.append(Route("edge-runtime", "camera", counted(lambda c, i: _trigger(c, i % cameras), count),
                                    schema))
        elif cameras:
            shown = CameraParts(camera_files, frames.turn())
            our_routes.append(Route("edge-runtime", "camera", counted(shown.send, count), schema, parts=shown.parts))
    result: dict[str, Any] = {"workload": workload, "servers": {}}
    reports: list[RouteReport] = []
    if not args.no_ours:
        result["servers"]["edge-runtime"] = ours.describe()
        reports += measure(ours, our_routes, args)
    peer_note = None
    if args.vllm_model is not None:
        vllm = VllmServer(work, args.vllm_model, args.parallel, args.context, pythonpath=args.vllm_pythonpath,
                          backend=args.vllm_backend, extra_args=args.vllm_args.split())
        result["servers"]["vllm"] = vllm.describe() | {"version": vllm.version()}
        reports += measure(vllm, [chat_routes("vllm", system, prompt, schema, max_tokens, image and image.turn())],
                           args)
    elif peer_bin is None:
        peer_note = "peer skipped (--no-peer)"
    elif workload == "image" and mmproj is None:
        peer_note = "peer skipped: the bundle has an ONNX encoder, llama-server needs a GGUF + mmproj pair"
    else:
        peer = LlamaServer(work, peer_bin, language, args.threads, args.parallel, args.context,
                           mmproj=mmproj if workload == "image" else None, image_max_tokens=image_tokens,
                           chat_template=chat_template_for(manifest), gpu_layers=args.gpu_layers,
                           no_repack=args.no_repack, extra_args=args.peer_args.split())
        result["servers"]["llama-server"] = peer.describe() | {"version": peer.version()}
        reports += measure(peer, [chat_routes("llama-server", system, prompt, schema, max_tokens,
                                              image and image.turn())], args)
    result["peer_note"] = peer_note
    result["routes"] = [asdict(r) for r in reports]
    peer_report = next((r for r in reports if r.server in PEERS), None)
    result["ratios_ours_over_peer"] = ({f"{r.server}.{r.route}": ratios(r, peer_report) for r in reports
                                        if r is not peer_report} if peer_report else {})
    result["request"] = chat_request(system, prompt, schema, max_tokens) | (
        {"image": f"640x480 JPEG (data URL), {len(image.jpegs)} distinct in turn"} if image else {})
    result["table"] = render(workload, reports, args.levels) + "\n\n" + render_stages(reports)
    return result


def ours_settings(ap: argparse.ArgumentParser, items: list[str]) -> dict[str, dict[str, Any]]:
    """`--ours-set` items as {section: {key: value}}, each value read as YAML."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not section or not name:
            ap.error(f"--ours-set {item!r}: expected SECTION.KEY=VALUE")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


def token_counter(language: Path) -> Callable[[str], int] | None:
    """Tokens of a verdict's text in the bundle's vocabulary (our infer and camera results carry no count;
    the stop token is not counted). None where llama.cpp cannot read the GGUF's vocabulary."""
    try:
        from edge_runtime.inference.llm.handles import Model

        model = Model(str(language), vocab_only=True)  # the process's lifetime: the count is used to its end
    except Exception:  # noqa: BLE001 - a count is a nicety; the benchmark runs without it
        return None
    lock = threading.Lock()

    def count(text: str) -> int:
        with lock:
            return len(model.vocab.tokenize(text.encode()))
    return count


def counted(send: Callable[[Client, int], Reply], count: Callable[[str], int] | None) -> Callable[[Client, int], Reply]:
    """`send` with the reply's completion tokens counted from its text where the server gave none."""
    def wrapped(client: Client, index: int) -> Reply:
        reply = send(client, index)
        if count is not None and reply.status == 200 and reply.completion_tokens is None:
            reply.completion_tokens = count(reply.text)
        return reply
    return wrapped


def render_stages(reports: list[RouteReport]) -> str:
    """Our routes side by side: tokens per verdict, p50, each `timings_ms` stage's p50 and `outside` (the
    latency less the result's total: queueing, journal, HTTP: ours outside the model), with ratios to chat."""
    ours = [r for r in reports if r.server not in PEERS]
    stages = list(dict.fromkeys(k for r in ours for k in r.stages_ms))
    if not ours:
        return ""
    chat = next((r for r in ours if r.route == "chat"), None)
    heads = ["route", "tokens/verdict", "p50 ms", *[f"{k} p50" for k in stages], "p50 / chat", "tokens / chat"]
    lines = ["our routes: p50 of each stage of the results' timings_ms (ms; chat replies carry none); "
             "outside = latency less total (queue, journal, HTTP: ours outside the model)", "",
             "| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for r in ours:
        lines.append("| " + " | ".join([r.route, _fmt(r.tokens_per_verdict), _fmt(r.latency_ms.get("p50"))]
                                       + [_fmt(r.stages_ms.get(k)) for k in stages]
                                       + [_fmt(_ratio(r.latency_ms.get("p50"), chat and chat.latency_ms.get("p50"))),
                                          _fmt(_ratio(r.tokens_per_verdict, chat and chat.tokens_per_verdict))])
                     + " |")
    return "\n".join(lines)


def _trigger(client: Client, camera: int) -> Reply:
    reply = client.post(f"/api/v1/cameras/cam{camera}/trigger", b"{}")
    if reply.status == 200:
        reply.text, reply.finish_reason = reply.body.get("text", ""), "stop"
    return reply


def machine() -> dict[str, Any]:
    try:
        llama_version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        llama_version = "absent"
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "llama_cpp_python": llama_version,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True, help="the bundle folder our daemon loads")
    ap.add_argument("--workload", choices=("chat", "image", "both"), default="chat")
    ap.add_argument("--routes", default="chat,infer,camera", help="ours, image workload: chat,infer,camera")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads, the same for both")
    ap.add_argument("--clients", default="1,2,4,8", help="concurrency levels")
    ap.add_argument("--parallel", type=int, help="llama-server -np and our in-flight bound (default: most clients)")
    ap.add_argument("--requests", type=int, default=8, help="requests per level (sequential and each concurrent)")
    ap.add_argument("--streamed", type=int, default=4, help="streamed requests for time to first token")
    ap.add_argument("--context", type=int, default=2048, help="context tokens per sequence (llama-server: per slot)")
    ap.add_argument("--gpu-layers", type=int, default=0, help="-1 offloads every layer (both servers)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a request may take")
    ap.add_argument("--same-image", action="store_true", help="image workload: one JPEG in every request (a "
                    "prompt cache then skips its encode and prefill; a camera never repeats a frame)")
    peer = ap.add_mutually_exclusive_group()
    peer.add_argument("--peer-bin", type=Path, help="a llama-server binary (default: build or reuse the cached one)")
    peer.add_argument("--no-peer", action="store_true", help="our daemon alone")
    ap.add_argument("--peer-args", default="", help="more llama-server arguments, e.g. --peer-args=--no-jinja (a "
                    "Qwen-template GGUF of tiny vocabulary fails its jinja path's grammar: 'Failed to initialize "
                    "samplers')")
    peer.add_argument("--vllm-model", type=Path, help="the peer is vLLM's OpenAI server on this Hugging Face "
                      "checkpoint folder (benchmarks/realistic_pair.py's hf/), with response_format json_schema "
                      "through its structured outputs")
    ap.add_argument("--vllm-pythonpath", help="put first on vLLM's PYTHONPATH (a --target install of its wheels)")
    ap.add_argument("--vllm-backend", default="xgrammar", help="vLLM's structured-output backend (xgrammar, "
                    "guidance); always with disable_any_whitespace")
    ap.add_argument("--vllm-args", default="", help="more vLLM server arguments, e.g. --vllm-args=--enforce-eager")
    ap.add_argument("--no-ours", action="store_true", help="the peer alone (our daemon not started)")
    ap.add_argument("--cuda-arch", help="build the peer with CUDA for this architecture (90 = H200)")
    ap.add_argument("--repack", choices=("on", "off"), default="on",
                    help="llama.cpp's extra CPU buffer types (weight repacking, AMX), the same in both servers; off "
                    "where llama.cpp was built with AMX kernels on a VM that faults on them (peers_lib/launch.py)")
    ap.add_argument("--peer-cmake-args", default=os.environ.get("LLAMA_CMAKE_ARGS", _MAKEFILE_CMAKE_ARGS),
                    help="cmake flags of the peer's build: the ones our llama-cpp-python was built with "
                    "(default: $LLAMA_CMAKE_ARGS, else the Makefile's: the AMX kernels left out)")
    ap.add_argument("--ours-src", type=Path, help="run our daemon from this source tree (e.g. `git archive` of a "
                    "commit) instead of the installed package")
    ap.add_argument("--ours-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a setting of our daemon's config, VALUE as YAML (e.g. model.flash_attention=false); "
                    "repeatable")
    ap.add_argument("--out", type=Path, help="write the whole report as JSON here")
    args = ap.parse_args(argv)
    args.ours_set = ours_settings(ap, args.ours_set)
    args.levels = [int(n) for n in args.clients.split(",") if n.strip()]
    args.parallel = args.parallel or max(args.levels)
    args.routes = {r.strip() for r in args.routes.split(",")}
    args.bundle = args.bundle.resolve()
    args.no_repack = args.repack == "off"
    peer_bin = None
    if not args.no_peer and args.vllm_model is None:
        if args.peer_bin is not None:
            peer_bin = args.peer_bin
        else:
            from peers_lib.build import build_server
            print("building or reusing llama-server (cached under ~/.cache/edge-runtime/llama-server)", file=sys.stderr)
            peer_bin = build_server(cuda_arch=args.cuda_arch, cmake_args=args.peer_cmake_args.split())
    workloads = ["chat", "image"] if args.workload == "both" else [args.workload]
    report: dict[str, Any] = {"machine": machine(), "threads": args.threads, "levels": args.levels,
                              "no_repack": args.no_repack, "ours_src": str(args.ours_src or ""),
                              "ours_set": args.ours_set,
                              "parallel": args.parallel, "requests_per_level": args.requests,
                              "same_image": args.same_image,
                              "bundle": str(args.bundle), "workloads": []}
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        for w in workloads:
            work = Path(tmp) / w
            work.mkdir()
            result = run_workload(w, args, work, peer_bin)
            report["workloads"].append(result)
            print(result["table"] + "\n", flush=True)
            if result["peer_note"]:
                print(result["peer_note"] + "\n", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so the server running now is stopped too (it has its own session)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())

"""Offload end to end against a real central server (issue 45): a device daemon offloads a remote camera and
escalates a local camera's verdicts to vLLM (or any OpenAI-compatible server), the server is stopped mid-run
and started again, and every frame is accounted for.

1. The central server starts (`--vllm-model`: vLLM's OpenAI server on that checkpoint, peers_lib VllmServer;
   `--central-bundle`: another edge-runtime on that bundle, the CPU check of this script).
2. Probe: `--probe` requests built by the device's own request builder (fleet/offload/client.chat_request)
   go straight to the server; each answer goes through the device's reader (parse_answer): accepted, or
   refused with its reason. The body's keys, usage, finish reasons and reasoning fields are recorded.
3. The device daemon (`edge-runtime run`, the local bundle) runs two cameras on a folder of parts: `remote`
   (remote: true) and `local` (escalate when the local verdict's `defect` equals the value it gives: tried
   with true, restarted with false when its first local verdicts are all false).
4. After remote results and second opinions arrive the central server is stopped (SIGTERM): the breaker must
   open and frames fall back to local inspection; the server starts again (same port): the breaker must
   close and remote results resume. Then both cameras are disabled (SIGHUP reload), the offload queue drains
   and the journal is read back through /api/v1/results.

Checks (exit 1 when one fails): every journaled verdict valid against the bundle's schema; the remote
camera's journal rows by source.engine equal the offload counters (remote, fallback_local); nothing dropped
or failed; the breaker opened and closed again; second opinions journaled with source.second_opinion_of.

    python benchmarks/offload_vllm.py --bundle /tmp/models/pair3b --vllm-model /tmp/models/pair3b.work/hf \\
        --vllm-pythonpath /tmp/vsite --gpu-layers -1 --out offload.json
    python benchmarks/offload_vllm.py --bundle DEMO --central-bundle DEMO     # CPU: edge-runtime as the center
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_lib.servers import OurDaemon, Server, VllmServer, read_bundle

from edge_runtime.fleet.offload.client import RemoteError, chat_request, parse_answer


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(what: str, check: Any, timeout_s: float, every_s: float = 0.25) -> float:
    """Seconds until `check()` is true; raises TimeoutError naming `what`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            if check():
                return round(time.monotonic() - t0, 2)
        except OSError:
            pass
        time.sleep(every_s)
    raise TimeoutError(f"no {what} after {timeout_s:.0f} s")


def write_parts(folder: Path, count: int) -> list[Path]:
    """`count` different 640x480 parts as JPEG files (every third with a defect), what the cameras read."""
    import cv2

    from edge_runtime.core.samples import part_image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"part{i:03d}.jpg"
        cv2.imwrite(str(path), part_image(3 + i, 640, 480, defect=i % 3 == 0), [cv2.IMWRITE_JPEG_QUALITY, 90])
        paths.append(path)
    return paths


def probe(url: str, schema: dict[str, Any], prompt: str, parts: list[Path], max_tokens: int) -> dict[str, Any]:
    """The device's own request and reader against the server: what is accepted, what refused and why."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    accepted, refused = 0, Counter[str]()
    finish, keys, usage_keys, message_keys = Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    sample: dict[str, Any] | None = None
    latencies = []
    for path in parts:
        body = chat_request(path.read_bytes(), prompt, schema, "default", max_tokens)
        t0 = time.perf_counter()
        status, raw = post_json(url + "/chat/completions", body)
        latencies.append(round((time.perf_counter() - t0) * 1000, 1))
        if status != 200:
            refused[f"HTTP {status}: {raw[:160].decode(errors='replace')}"] += 1
            continue
        answer = json.loads(raw)
        sample = sample or answer
        keys.update(answer.keys())
        usage_keys.update((answer.get("usage") or {}).keys())
        choice = (answer.get("choices") or [{}])[0]
        finish[str(choice.get("finish_reason"))] += 1
        message_keys.update(k for k, v in (choice.get("message") or {}).items() if v not in (None, [], ""))
        try:
            parse_answer(raw, validator)
            accepted += 1
        except RemoteError as exc:
            refused[str(exc)[:160]] += 1
    if sample is not None:  # the content is the verdict; shorten it, keep the shape
        for choice in sample.get("choices") or []:
            choice.get("message", {})["content"] = str(choice.get("message", {}).get("content"))[:200]
    return {"requests": len(parts), "accepted": accepted, "refused": dict(refused), "finish_reasons": dict(finish),
            "body_keys": dict(keys), "usage_keys": dict(usage_keys), "message_fields_set": dict(message_keys),
            "latency_ms": latencies, "sample_body": sample}


class CentralDaemon(OurDaemon):
    """Another edge-runtime as the central server (the CPU check: the protocol vLLM speaks)."""

    name = "central-edge-runtime"


def central_server(args: argparse.Namespace, work: Path, port: int | None) -> Server:
    server: Server
    if args.vllm_model is not None:
        server = VllmServer(work, args.vllm_model, parallel=16, context=args.context,
                            pythonpath=args.vllm_pythonpath, backend=args.vllm_backend,
                            extra_args=args.vllm_args.split())
    else:
        server = CentralDaemon(work, args.central_bundle, args.threads, 4, args.context,
                               gpu_layers=args.gpu_layers)
    if port is not None:  # a restart answers on the same URL the device has
        server.port = port
        if isinstance(server, CentralDaemon):
            server.config["api"]["port"] = port
            server.config_path.write_text(yaml.safe_dump(server.config, sort_keys=False))
        else:
            server.args[server.args.index("--port") + 1] = str(port)
    return server


def device_daemon(args: argparse.Namespace, work: Path, central_url: str, parts: Path,
                  escalate_defect: bool) -> OurDaemon:
    offload = {"enabled": True, "endpoints": [{"url": central_url, "model": "default", "timeout_s": args.timeout}],
               "escalate": {"when": {"defect": escalate_defect}}, "fallback": "local",
               "retry": {"attempts": 2, "backoff_s": 0.2}, "breaker": {"failures": 2, "open_s": args.open_s},
               "max_tokens": args.max_tokens}
    device = OurDaemon(work, args.bundle, args.threads, 4, args.context, gpu_layers=args.gpu_layers,
                       extra={"offload": offload})
    device.config["device_id"] = "offload-device"
    device.config["cameras"] = [
        {"name": "remote", "source": str(parts), "kind": "folder", "remote": True,
         "trigger": {"mode": "interval", "interval_s": args.interval}},
        {"name": "local", "source": str(parts), "kind": "folder",
         "trigger": {"mode": "interval", "interval_s": args.interval * 2}}]
    device.config_path.write_text(yaml.safe_dump(device.config, sort_keys=False))
    return device


def results(base: str, camera: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = get_json(f"{base}/api/v1/results?camera={camera}&limit=1000")["results"]
    return rows


def offload_status(base: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(f"{base}/api/v1/status")["offload"]
    return status


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    manifest = read_bundle(args.bundle)
    schema = manifest["verdict_schema"]
    prompt = (manifest.get("prompt") or {}).get("default") or "Inspect the part."
    parts_dir = work / "parts"
    parts = write_parts(parts_dir, args.parts)
    report: dict[str, Any] = {"bundle": str(args.bundle), "central": str(args.vllm_model or args.central_bundle),
                              "timings_s": {}, "checks": {}}
    t = report["timings_s"]
    (work / "central1").mkdir()
    central = central_server(args, work / "central1", None)
    t0 = time.monotonic()
    central.__enter__()
    try:
        t["central_ready"] = round(time.monotonic() - t0, 2)
        url = f"{central.base}/v1"
        report["central_command"] = " ".join(central.command())
        report["probe"] = probe(url, schema, prompt, parts[:args.probe], args.max_tokens)
        print("probe", json.dumps({k: v for k, v in report["probe"].items() if k != "sample_body"}), flush=True)
        device = None
        for escalate_defect in (True, False):
            (work / f"device-{escalate_defect}").mkdir()
            device = device_daemon(args, work / f"device-{escalate_defect}", url, parts_dir, escalate_defect)
            t1 = time.monotonic()
            device.__enter__()
            t["device_ready"] = round(time.monotonic() - t1, 2)
            base = device.base
            wait_until("local verdicts", lambda b=base: len(results(b, "local")) >= 3, 120)
            if any(r["verdict"].get("defect") is escalate_defect for r in results(base, "local")
                   if r["source"]["engine"] == "edge"):
                break
            device.__exit__()  # every local verdict said the other value: escalate on that one instead
        assert device is not None
        report["escalate_when_defect"] = escalate_defect
        t["remote_and_second_opinions"] = wait_until(
            "remote results and second opinions",
            lambda: (offload_status(base)["frames"]["remote"] >= args.before
                     and offload_status(base)["second_opinions"]["answered"] >= 2), 180)
        report["before_outage"] = offload_status(base)
        # --- the outage: the central server stops
        t2 = time.monotonic()
        central.__exit__()
        t["central_stopped"] = round(time.monotonic() - t2, 2)
        state = lambda: offload_status(base)["endpoints"][0]["state"]  # noqa: E731
        wait_until("breaker open", lambda: state() in ("open", "half_open"), 120)
        t["breaker_open_after_stop"] = round(time.monotonic() - t2, 2)
        fallback_before = offload_status(base)["frames"]["fallback_local"]
        wait_until("local fallback", lambda: offload_status(base)["frames"]["fallback_local"] >= fallback_before + 3,
                   120)
        report["during_outage"] = offload_status(base)
        # --- the central server starts again, on the same port
        (work / "central2").mkdir()
        central = central_server(args, work / "central2", central.port)
        t3 = time.monotonic()
        central.__enter__()
        t["central_ready_again"] = round(time.monotonic() - t3, 2)
        wait_until("breaker closed", lambda: state() == "closed", 120)
        t["breaker_closed_after_start"] = round(time.monotonic() - t3, 2)
        remote_before = offload_status(base)["frames"]["remote"]
        wait_until("remote results after the restart",
                   lambda: offload_status(base)["frames"]["remote"] >= remote_before + 3, 120)
        # --- stop the cameras, drain, read the journal back
        for cam in device.config["cameras"]:
            cam["enabled"] = False
        device.config_path.write_text(yaml.safe_dump(device.config, sort_keys=False))
        assert device.proc is not None
        device.proc.send_signal(signal.SIGHUP)
        wait_until("offload drained", lambda: offload_status(base)["frames"]["in_flight"] == 0, 120)
        time.sleep(args.settle)  # the local queue's last fallback frames are journaled
        final = offload_status(base)
        report["final"] = final
        rows = {cam: results(base, cam) for cam in ("remote", "local")}
        report["metrics_breaker"] = [line for line in urllib.request.urlopen(f"{base}/metrics", timeout=10).read()
                                     .decode().splitlines() if line.startswith("edge_offload_breaker")]
        device.__exit__()
    finally:
        central.__exit__()
    report["journal"] = account(rows, schema, final)
    report["checks"] = checks(report["journal"], final, report)
    return report


def account(rows: dict[str, list[dict[str, Any]]], schema: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    out: dict[str, Any] = {}
    for cam, found in rows.items():
        by = Counter(f"{r['source']['engine']}:{r['source'].get('reason', 'local')}" for r in found)
        out[cam] = {"rows": len(found), "by_engine_reason": dict(by),
                    "schema_valid": sum(validator.is_valid(r["verdict"]) for r in found),
                    "second_opinions_linked": sum(1 for r in found if r["source"].get("second_opinion_of")),
                    "remote_models": sorted({str(r["source"].get("model")) for r in found
                                             if r["source"]["engine"] == "remote"})}
    return out


def checks(journal: dict[str, Any], final: dict[str, Any], report: dict[str, Any]) -> dict[str, bool]:
    frames = final["frames"]
    remote = journal["remote"]["by_engine_reason"]
    ep = final["endpoints"][0]
    return {
        "every_verdict_schema_valid": all(j["schema_valid"] == j["rows"] for j in journal.values()),
        "remote_rows_equal_counter": remote.get("remote:remote", 0) == frames["remote"],
        "fallback_rows_equal_counter": remote.get("edge:local", 0) == frames["fallback_local"],
        "nothing_dropped_or_failed": frames["dropped"] == 0 and frames["failed"] == 0,
        "accounted": frames["taken"] == (frames["remote"] + frames["fallback_local"] + frames["dropped"]
                                         + frames["failed"] + frames["in_flight"]),
        "breaker_opened_and_closed": ep["opened"] >= 1 and ep["state"] == "closed",
        "second_opinions_journaled": journal["local"]["second_opinions_linked"]
        == final["second_opinions"]["answered"] > 0,
        "probe_all_accepted": report["probe"]["accepted"] == report["probe"]["requests"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True, help="the device's bundle")
    center = ap.add_mutually_exclusive_group(required=True)
    center.add_argument("--vllm-model", type=Path, help="vLLM's OpenAI server on this Hugging Face checkpoint")
    center.add_argument("--central-bundle", type=Path, help="another edge-runtime on this bundle as the center")
    ap.add_argument("--vllm-pythonpath", help="vLLM's PYTHONPATH (a --target install of its wheels)")
    ap.add_argument("--vllm-backend", default="xgrammar", help="vLLM's structured-output backend")
    ap.add_argument("--vllm-args", default="", help="more vLLM server arguments")
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.5, help="the remote camera's trigger interval (s); the "
                    "local camera's is twice it")
    ap.add_argument("--parts", type=int, default=24, help="distinct part images the cameras cycle through")
    ap.add_argument("--probe", type=int, default=12, help="direct requests through the device's reader")
    ap.add_argument("--before", type=int, default=6, help="remote results before the outage")
    ap.add_argument("--open-s", type=float, default=2.0, help="offload.breaker.open_s")
    ap.add_argument("--timeout", type=float, default=30, help="offload endpoint timeout_s")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds for the last local fallbacks to land")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    args.bundle = args.bundle.resolve()
    with tempfile.TemporaryDirectory(prefix="offload-") as tmp:
        try:
            report = run(args, Path(tmp))
        except (TimeoutError, RuntimeError, AssertionError) as exc:
            logs = {p.name: p.read_text(errors="replace")[-3000:] for p in Path(tmp).rglob("*.log")}
            report = {"error": f"{type(exc).__name__}: {exc}", "logs": logs}
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text)
    print(json.dumps({k: report.get(k) for k in ("error", "timings_s", "checks", "journal", "escalate_when_defect")},
                     indent=1))
    if "final" in report:
        print("frames", json.dumps(report["final"]["frames"]), "second opinions",
              json.dumps(report["final"]["second_opinions"]))
    return 0 if report.get("checks") and all(report["checks"].values()) else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())

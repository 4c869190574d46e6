"""Soak: a real daemon process with four cameras, MQTT and a steady API load; RSS and open-file slopes.

    python benchmarks/soak.py --minutes 30 --out soak.json

Starts a private Mosquitto (when installed) and `edge-runtime run` on the demo bundle with four looping
video cameras, then loads the REST and OpenAI endpoints from a few client threads on loopback while it
samples the daemon's RSS, open file descriptors and threads every `--sample-s` seconds. The slopes are
least-squares fits over the samples after `--warmup-min` minutes: a leak shows as a positive slope that
does not level off. Every request loop is bounded by the run's duration; everything stops by itself.

    python benchmarks/soak.py --swaps 30 --swap-between A B --cameras 0 --out swaps.json

Model swaps instead: rewrites the config's `model.path` between bundles A and B and sends SIGHUP (what
`systemctl reload` does), waits for the daemon's READY=1 on a notify socket it plays systemd with, makes
one API inspection and samples RSS after each swap. Each of `--variants` is its own daemon: `trim` as
shipped, `notrim` with core/heap.py's trim turned off, `:arenaN` with MALLOC_ARENA_MAX=N.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import os
import shutil
import signal
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
import requests

from edge_runtime.core.samples import part_image, write_sample_video


class _Hooks(http.server.BaseHTTPRequestHandler):
    received = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Hooks.received += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def start_webhook_receiver() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_sample(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
    }


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour."""
    if len(points) < 3:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 3600 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


class Load:
    """A steady mix of API calls from a few threads; counts answers by status class."""

    def __init__(self, base: str, seconds: float) -> None:
        self.base, self.deadline = base, time.monotonic() + seconds
        self.counts: dict[str, int] = {}
        self.health_ms: list[float] = []
        self._lock = threading.Lock()
        jpeg = cv2.imencode(".jpg", part_image(3, 640, 480))[1].tobytes()
        self.jpeg = jpeg
        self.data_url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def _call(self, s: requests.Session, method: str, path: str, **kw: Any) -> None:
        try:
            r = s.request(method, self.base + path, timeout=30, **kw)
            self._count(f"{method} {path.split('?')[0]} {r.status_code}")
            r.close()
        except requests.RequestException as exc:
            self._count(type(exc).__name__)

    def readers(self) -> None:
        with requests.Session() as s:
            while time.monotonic() < self.deadline:
                for path in ("/api/v1/status", "/api/v1/results?limit=50", "/metrics", "/"):
                    self._call(s, "GET", path)
                t0 = time.perf_counter()
                self._call(s, "GET", "/healthz")
                with self._lock:
                    self.health_ms.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.2)

    def inference(self) -> None:
        with requests.Session() as s:
            while time.monotonic() < self.deadline:
                self._call(s, "POST", "/api/v1/infer", files={"image": ("p.jpg", self.jpeg)})
                self._call(s, "POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "Is this part OK?"},
                        {"type": "image_url", "image_url": {"url": self.data_url}}]}],
                    "max_tokens": 48})
                time.sleep(0.5)

    def streams(self) -> None:
        """Open the live event stream for a few seconds, then drop it, over and over."""
        while time.monotonic() < self.deadline:
            try:
                with requests.get(self.base + "/api/v1/events", stream=True, timeout=10) as r:
                    end = time.monotonic() + 5
                    for _ in r.iter_lines():
                        if time.monotonic() > end:
                            break
                self._count("stream")
            except requests.RequestException as exc:
                self._count(type(exc).__name__)
            time.sleep(1)


def start_broker(tmp: Path) -> tuple[subprocess.Popen[bytes] | None, int]:
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
    if exe is None:
        return None, 0
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    + ("user root\n" if os.geteuid() == 0 else ""))
    return subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port


def wait_ready(daemon: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/readyz", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        if daemon.poll() is not None:
            raise SystemExit(f"daemon exited with {daemon.returncode}: {log_path.read_text()}")
        time.sleep(1)
    raise SystemExit(f"daemon not ready after 180 s: {log_path.read_text()[-3000:]}")


def stop_daemon(daemon: subprocess.Popen[bytes], wait_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `wait_s`."""
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(wait_s)
    except subprocess.TimeoutExpired:
        daemon.kill()


def camera_yaml(video: Path, count: int) -> str:
    return "cameras:\n" + "".join(f"  - name: cam{i}\n    source: {video}\n    fps: 10\n"
                                   "    trigger: {mode: interval, interval_s: 0.5}\n" for i in range(count)) \
        if count else "cameras: []\n"


# The daemon as shipped, but with core/heap.py's trim turned off: the "without the fix" variant.
_UNTRIMMED = ("import runpy, edge_runtime.core.heap as heap; heap._malloc_trim = lambda: None; "
              "runpy.run_module('edge_runtime', run_name='__main__', alter_sys=True)")


def swap_variant(tmp: Path, variant: str, bundles: tuple[Path, Path], swaps: int, cameras: str,
                 jpeg: bytes) -> dict[str, Any]:
    """One daemon that swaps between `bundles` `swaps` times; RSS (and its anonymous part: the heap) after
    each swap's inspection."""
    trim, _, arena = variant.partition(":arena")
    api_port = free_port()
    config = tmp / f"{variant.replace(':', '-')}.yaml"
    head = (f"device_id: swaps\ndata_dir: {tmp / 'data'}\napi:\n  host: 127.0.0.1\n  port: {api_port}\n"
            f"mqtt:\n  enabled: false\ngovernor:\n  enabled: false\n{cameras}")
    config.write_text(f"{head}model:\n  path: {bundles[0]}\n  threads: 2\n")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(config.with_suffix(".notify")))
    notify.settimeout(300)
    env = {**os.environ, "NOTIFY_SOCKET": str(config.with_suffix(".notify"))}
    if arena:
        env["MALLOC_ARENA_MAX"] = arena
    start = ["-c", _UNTRIMMED] if trim == "notrim" else ["-m", "edge_runtime"]
    log_path = config.with_suffix(".log")
    log = open(log_path, "wb")  # closed after the daemon stops
    daemon = subprocess.Popen([sys.executable, *start, "--config", str(config), "--log-level", "warning", "run"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{api_port}"
    samples: list[dict[str, float]] = []
    try:
        wait_ready(daemon, base, log_path)

        def inspect_and_sample(reload_s: float) -> None:
            r = requests.post(base + "/api/v1/infer", files={"image": ("p.jpg", jpeg)}, timeout=300)
            if r.status_code != 200:
                raise SystemExit(f"{variant}: inspection answered {r.status_code}: {r.text[:300]}")
            status = Path(f"/proc/{daemon.pid}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            samples.append({"swap": len(samples), "reload_s": round(reload_s, 2),
                            "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
                            "anon_mb": round(int(fields["RssAnon"].split()[0]) / 1024, 1)})

        inspect_and_sample(0.0)
        for i in range(swaps):
            target = bundles[(i + 1) % 2]
            config.write_text(f"{head}model:\n  path: {target}\n  threads: 2\n")
            t0 = time.perf_counter()
            daemon.send_signal(signal.SIGHUP)
            for word in (b"RELOADING=1", b"READY=1"):  # the start's READY=1 is still queued: skip it
                while word not in notify.recv(4096):
                    pass
            reload_s = time.perf_counter() - t0
            model = requests.get(base + "/api/v1/status", timeout=10).json()["model"]
            if Path(model["path"]) != target:
                raise SystemExit(f"{variant}: swap {i + 1} did not load {target}: {log_path.read_text()[-2000:]}")
            inspect_and_sample(reload_s)
    finally:
        stop_daemon(daemon, 60)
        log.close()
        notify.close()
    later = samples[len(samples) // 2:]  # the second half: where an allocator that levels off is flat
    return {"variant": variant, "daemon_exit_code": daemon.returncode,
            "rss_mb": {"start": samples[0]["rss_mb"], "end": samples[-1]["rss_mb"],
                       "per_swap": round((samples[-1]["rss_mb"] - samples[0]["rss_mb"]) / max(swaps, 1), 2),
                       "per_swap_second_half": round(slope_per_hour(
                           [(s["swap"], s["rss_mb"]) for s in later]) / 3600, 2)},
            "anon_mb": {"start": samples[0]["anon_mb"], "end": samples[-1]["anon_mb"]},
            "reload_s_p50": round(statistics.median(s["reload_s"] for s in samples[1:]), 2) if swaps else None,
            "samples": samples}


def swap_run(args: argparse.Namespace) -> dict[str, Any]:
    jpeg = cv2.imencode(".jpg", part_image(3, 640, 480))[1].tobytes()
    bundles = (args.swap_between[0].resolve(), args.swap_between[1].resolve())
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        video = write_sample_video(tmp / "line.avi", frames=150, width=640, height=480)
        runs = [swap_variant(tmp, v, bundles, args.swaps, camera_yaml(video, args.cameras), jpeg)
                for v in args.variants.split(",")]
    return {"swaps": args.swaps, "between": [str(b) for b in bundles], "cameras": args.cameras, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--cameras", type=int, default=4)
    ap.add_argument("--sample-s", type=float, default=15)
    ap.add_argument("--warmup-min", type=float, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-rules", action="store_true",
                    help="without the rule that alerts, posts a webhook and marks a review on every verdict")
    ap.add_argument("--swaps", type=int, default=0, help="model swaps instead of the timed soak")
    ap.add_argument("--swap-between", type=Path, nargs=2, metavar=("A", "B"), help="the two bundles to swap")
    ap.add_argument("--variants", default="notrim,trim,notrim:arena2,trim:arena2",
                    help="comma-separated daemons for --swaps: trim|notrim, optionally :arenaN (MALLOC_ARENA_MAX)")
    args = ap.parse_args()
    if args.swaps:
        if not args.swap_between:
            ap.error("--swaps needs --swap-between A B")
        swapped = swap_run(args)
        if args.out:
            args.out.write_text(json.dumps(swapped, indent=1))
        print(json.dumps({**swapped, "runs": [{k: v for k, v in r.items() if k != "samples"}
                                              for r in swapped["runs"]]}))
        return
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        broker, mqtt_port = start_broker(tmp)
        video = write_sample_video(tmp / "line.avi", frames=150, width=640, height=480)
        api_port = free_port()
        mqtt = f"mqtt:\n  host: 127.0.0.1\n  port: {mqtt_port}\n" if broker else "mqtt:\n  enabled: false\n"
        hooks = None if args.no_rules else start_webhook_receiver()
        # Every verdict fires: its alert, webhook and review mark commit with it in one transaction.
        rules = "" if hooks is None else (
            "rules:\n  - name: every\n    actions:\n      - {type: alert}\n"
            f"      - {{type: webhook, url: 'http://127.0.0.1:{hooks.server_address[1]}/hook'}}\n"
            "      - {type: review}\n")
        (tmp / "soak.yaml").write_text(
            f"device_id: soak\ndata_dir: {tmp / 'data'}\nmodel:\n  threads: 2\n"
            f"api:\n  host: 127.0.0.1\n  port: {api_port}\n{mqtt}governor:\n  enabled: false\n{rules}"
            + camera_yaml(video, args.cameras))
        log = open(tmp / "daemon.log", "wb")  # closed after the daemon stops
        daemon = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(tmp / "soak.yaml"),
                                   "--log-level", "warning", "run"], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{api_port}"
        try:
            wait_ready(daemon, base, tmp / "daemon.log")
            load = Load(base, seconds)
            workers = [threading.Thread(target=load.readers, daemon=True) for _ in range(2)]
            workers += [threading.Thread(target=load.inference, daemon=True),
                        threading.Thread(target=load.streams, daemon=True)]
            for w in workers:
                w.start()
            t_start = time.monotonic()
            samples: list[dict[str, float]] = []
            while time.monotonic() - t_start < seconds:
                if daemon.poll() is not None:
                    raise SystemExit(f"daemon died with {daemon.returncode}")
                samples.append({"t": round(time.monotonic() - t_start, 1), **proc_sample(daemon.pid)})
                time.sleep(args.sample_s)
            for w in workers:
                w.join(60)
            status = requests.get(base + "/api/v1/status", timeout=10).json()
        finally:
            stop_daemon(daemon)
            log.close()
            if broker is not None:
                broker.terminate()
                broker.wait(10)
            if hooks is not None:
                hooks.shutdown()
        steady = [s for s in samples if s["t"] >= args.warmup_min * 60] or samples
        health = sorted(load.health_ms)
        report = {
            "minutes": args.minutes, "cameras": args.cameras, "mqtt": broker is not None,
            "daemon_exit_code": daemon.returncode,
            "rss_mb": {"start": round(samples[0]["rss_mb"], 1), "end": round(samples[-1]["rss_mb"], 1),
                       "peak": round(max(s["rss_mb"] for s in samples), 1),
                       "slope_mb_per_h": round(slope_per_hour([(s["t"], s["rss_mb"]) for s in steady]), 2)},
            "fds": {"start": samples[0]["fds"], "end": samples[-1]["fds"],
                    "slope_per_h": round(slope_per_hour([(s["t"], s["fds"]) for s in steady]), 2)},
            "threads": {"start": samples[0]["threads"], "end": samples[-1]["threads"]},
            "requests": load.counts,
            "healthz_ms": {"p50": round(statistics.median(health), 1) if health else None,
                           "max": round(health[-1], 1) if health else None},
            "inspected": status.get("inspection", {}).get("inspected"),
            "journal": status.get("journal"),
            "rules": status.get("rules") if hooks is not None else None,
            "webhooks": status.get("webhooks") if hooks is not None else None,
            "webhooks_received": _Hooks.received if hooks is not None else None,
            "samples": samples,
        }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""The servers as processes: our daemon (`edge-runtime run` with a generated config), llama-server and vLLM.

Each starts on a free loopback port, is ready when its health route says so, and reports its peak
resident memory (the kernel's VmHWM of the process) and, where nvidia-smi exists, the most GPU memory
it held while the workload ran (sampled every 0.5 s). One server runs at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import yaml

_BENCHMARKS = Path(__file__).resolve().parents[1]  # on PYTHONPATH for `-m peers_lib.launch`


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def session_pids(leader: int) -> set[int]:
    """The processes of the session `leader` started (start_new_session): vLLM's engine runs in children."""
    pids = {leader}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 3 and fields[3] == str(leader):  # field 6 of stat: the session id
            pids.add(int(stat.parent.name))
    return pids


class GpuMemory:
    """Most memory (MiB) nvidia-smi reports for one process and the others of its session, summed, while
    sampling runs; None without nvidia-smi."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_mib = pid, None if shutil.which("nvidia-smi") is None else 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.peak_mib is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
            out = subprocess.run(query, capture_output=True, text=True).stdout
            ours, total = session_pids(self.pid), 0
            for line in out.splitlines():
                pid, _, mib = line.partition(",")
                if pid.strip().isdigit() and int(pid) in ours and mib.strip().isdigit():
                    total += int(mib)
            self.peak_mib = max(self.peak_mib or 0, total)

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.peak_mib


class Server:
    """A server process on `port`; `with` starts it and waits until `ready_path` answers 200."""

    name = "server"
    ready_path = "/health"

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] | None = None  # None: ours
        self.cwd: Path | None = None
        self.gpu: GpuMemory | None = None
        self._log: IO[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"command": " ".join(self.command())}

    def __enter__(self) -> Server:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env, cwd=self.cwd)
        try:
            self._wait_ready(timeout_s=600)
        except BaseException:
            self.__exit__()
            raise
        self.gpu = GpuMemory(self.proc.pid)
        self.gpu.start()
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was ready; "
                                   f"log {self.log_path}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.base + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} was not ready after {timeout_s:.0f} s; log {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def peak_rss_mb(self) -> float | None:
        """VmHWM of the process (read before it is stopped)."""
        if self.proc is None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            return None
        return None

    def peak_gpu_mib(self) -> int | None:
        return self.gpu.stop() if self.gpu is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:  # children left behind (vLLM's engine process) go with their leader
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.gpu is not None:
            self.gpu.stop()
        if self._log is not None:
            self._log.close()


class OurDaemon(Server):
    """`edge-runtime run` on the bundle; `parallel` requests may be in flight at once (the API's
    inference slots and the queue sized for them, parallel sequences up to it), as llama-server's -np.
    `cameras` on-demand cameras cam0.. show `image` (one file for all, or a list: one file each, re-read
    `camera_fps` times a second, so a file replaced between triggers is the next part)."""

    name = "edge-runtime"
    ready_path = "/readyz"

    def __init__(self, log_dir: Path, bundle: Path, threads: int, parallel: int, context: int,
                 cameras: int = 0, image: Path | list[Path] | None = None, gpu_layers: int = 0,
                 extra: dict[str, Any] | None = None, no_repack: bool = False, source: Path | None = None,
                 camera_fps: float | None = None) -> None:
        super().__init__(log_dir)
        self.no_repack = no_repack
        if source is not None:  # a source tree exported from one commit, ahead of the installed package
            self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(_BENCHMARKS)])}
            self.cwd = source  # `python -m` puts the working folder first on sys.path
        elif no_repack:
            self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (str(_BENCHMARKS), os.environ.get("PYTHONPATH", "")) if p)}
        self.data = Path(tempfile.mkdtemp(prefix="peers-data-", dir=log_dir))
        # absolute: the config file lies in log_dir, and its relative paths would be read from there
        bundle = Path(bundle).resolve()
        if isinstance(image, list):
            image = [p.resolve() for p in image]
        elif image is not None:
            image = Path(image).resolve()
        config: dict[str, Any] = {
            "device_id": "peers", "data_dir": str(self.data), "log_level": "warning",
            "model": {"path": str(bundle), "threads": threads, "context_size": context, "gpu_layers": gpu_layers},
            "mqtt": {"enabled": False}, "governor": {"enabled": False},
            # api.threads - api.threads // 2 requests may wait for a verdict at once (api/admission.py)
            "api": {"host": "127.0.0.1", "port": self.port, "threads": min(64, max(6, 2 * parallel)),
                    "request_timeout_s": 300},
            "inspection": {"queue_size": max(4, parallel), "max_batch": max(1, min(32, parallel))},
            "cameras": [{"name": f"cam{i}", "source": str(image[i] if isinstance(image, list) else image),
                         "kind": "image", "trigger": {"mode": "on_demand"},
                         **({"fps": camera_fps} if camera_fps else {})}
                        for i in range(cameras)] if image is not None else [],
        }
        for section, values in (extra or {}).items():
            config.setdefault(section, {}).update(values)
        self.config_path = log_dir / "edge-runtime.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.config = config

    def command(self) -> list[str]:
        entry = ["-m", "peers_lib.launch"] if self.no_repack else ["-m", "edge_runtime"]
        return [sys.executable, *entry, "--config", str(self.config_path), "run"]

    def describe(self) -> dict[str, Any]:
        return {"command": " ".join(self.command()), "config": self.config}


class LlamaServer(Server):
    """llama.cpp's server on the same GGUF (+ mmproj): `parallel` slots of `context` tokens each, prompt
    caching on, the same threads for prompt and generation."""

    name = "llama-server"

    def __init__(self, log_dir: Path, binary: Path, language: Path, threads: int, parallel: int, context: int,
                 mmproj: Path | None = None, image_max_tokens: int | None = None, chat_template: str | None = None,
                 gpu_layers: int = 0, no_repack: bool = False, extra_args: list[str] | None = None) -> None:
        super().__init__(log_dir)
        self.args = [str(binary), "-m", str(language), "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(context * parallel),
                     "--cache-prompt", "--no-webui", "-ngl", "all" if gpu_layers < 0 else str(gpu_layers)]
        if mmproj is not None:
            self.args += ["--mmproj", str(mmproj)]
            if gpu_layers == 0:
                self.args.append("--no-mmproj-offload")
            if image_max_tokens:
                self.args += ["--image-max-tokens", str(image_max_tokens)]
        if chat_template:
            self.args += ["--chat-template", chat_template]
        if no_repack:
            self.args.append("--no-repack")
        self.args += extra_args or []

    def command(self) -> list[str]:
        return self.args

    def version(self) -> str:
        try:
            out = subprocess.run([self.args[0], "--version"], capture_output=True, text=True, timeout=30)
            return (out.stdout + out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unknown"


# Settings vLLM 0.26.0 needs on the H200 machine (issue 45): without flashinfer (not carried) its top-k/top-p
# sampler dies at start; without disable_any_whitespace a random-weight model pads json_schema answers with
# whitespace until max_tokens.
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
VLLM_STRUCTURED = {"backend": "xgrammar", "disable_any_whitespace": True}


class VllmServer(Server):
    """vLLM's OpenAI server (`python3 -m vllm.entrypoints.openai.api_server`) on a Hugging Face checkpoint
    folder, served as "default" (the name every request carries), `parallel` sequences at most, `context`
    tokens each. `pythonpath` is put first (a --target install of the carried wheels); `backend` is the
    structured-output backend (xgrammar, guidance)."""

    name = "vllm"

    def __init__(self, log_dir: Path, model: Path, parallel: int, context: int, pythonpath: str | None = None,
                 backend: str = "xgrammar", extra_args: list[str] | None = None) -> None:
        super().__init__(log_dir)
        structured = json.dumps(VLLM_STRUCTURED | {"backend": backend})
        self.args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                     "--served-model-name", "default", "--host", "127.0.0.1", "--port", str(self.port),
                     "--max-model-len", str(context), "--max-num-seqs", str(parallel),
                     "--structured-outputs-config", structured, *(extra_args or [])]
        # vLLM's own install alone when given: our wheels (/tmp/site) carry other versions of shared packages
        self.env = {**os.environ, **VLLM_ENV, "PYTHONPATH": pythonpath or os.environ.get("PYTHONPATH", "")}

    def command(self) -> list[str]:
        return self.args

    def describe(self) -> dict[str, Any]:
        return {"command": " ".join(self.args), "env": VLLM_ENV}

    def version(self) -> str:
        try:
            out = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"], env=self.env,
                                 capture_output=True, text=True, timeout=120)
            return out.stdout.strip() or out.stderr.strip().splitlines()[-1]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "unknown"


def read_bundle(bundle: Path) -> dict[str, Any]:
    """bundle.yaml as data (the GGUF paths resolved against the folder)."""
    manifest: dict[str, Any] = yaml.safe_load((bundle / "bundle.yaml").read_text())
    return manifest


def bundle_files(bundle: Path) -> tuple[Path, Path | None]:
    """(language GGUF, mmproj GGUF or None) of either bundle format."""
    m = read_bundle(bundle)
    files = m.get("files") or {}
    if "language" in files:
        lm = bundle / files["language"]["path"]
        mm = bundle / files["mmproj"]["path"] if "mmproj" in files else None
        return lm, mm
    return bundle / "language.gguf", None


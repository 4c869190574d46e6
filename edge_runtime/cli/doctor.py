"""`edge-runtime doctor`: the checks a technician runs when something is wrong.

Each check gives ok / warn / fail / skip, what it saw, and for warn/fail the fix in one sentence.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import platform
import re
import shutil
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge_runtime.config import Config
from edge_runtime.core.cpuinfo import read_cpuinfo

# llama.cpp's name for an instruction set its CPU backend was compiled to use -> the word /proc/cpuinfo
# lists when the CPU has it (x86 `flags`, aarch64 `Features`). A build that uses one the CPU lacks dies
# with SIGILL at the first inference: a wheel built on another machine (`-march=native` on a newer x86, the
# Orin's armv8.2-a+dotprod on a Xavier, whose Carmel cores have no dot product).
CPU_FEATURES = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2",
    "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AVX_VNNI": "avx_vnni", "AMX_INT8": "amx_int8",
    "NEON": "asimd", "DOTPROD": "asimddp", "FP16_VA": "asimdhp", "SVE": "sve", "MATMUL_INT8": "i8mm", "SME": "sme",
}

# L4T release -> JetPack (major lines; NVIDIA's release notes).
JETPACK = {"36.4": "6.1/6.2", "36.3": "6.0", "36.2": "6.0 DP", "35.6": "5.1.4", "35.5": "5.1.3",
           "35.4": "5.1.2", "35.3": "5.1.1", "35.2": "5.1", "35.1": "5.0.2", "32.7": "4.6.x"}


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""


def llama_cpp_probe() -> tuple[str, bool]:
    """(llama-cpp-python version, whether this build offloads to a GPU)."""
    from edge_runtime.inference.llm.runtime import engine_info

    info = engine_info()
    return str(info["llama_cpp_python"]), bool(info["gpu_offload"])


def llama_cpp_system_info() -> str:
    from edge_runtime.inference.llm.runtime import system_info

    return system_info()


def compiled_cpu_features(system_info: str) -> list[str]:
    """The instruction sets llama.cpp's CPU backend was built with, from its `CPU : AVX = 1 | ...` section."""
    section, out = "", []
    for token in system_info.split("|"):
        m = re.fullmatch(r"(?:(\w+) : )?(\w+) = (\S+)", token.strip())
        if m:
            section = m.group(1) or section
            if section == "CPU" and m.group(3) == "1":
                out.append(m.group(2))
    return out


def jtop_client() -> Any:
    from jtop import jtop

    return jtop()


class Doctor:
    """Runs the checks. What it reads of the machine comes in through `root` (a filesystem tree) and
    the probes, so tests describe a CPU box, a GPU server or a Jetson without being one."""

    def __init__(self, config: Config, model_dir: str | None = None, root: Path = Path("/"),
                 find_library: Callable[[str], str | None] = ctypes.util.find_library,
                 llama_probe: Callable[[], tuple[str, bool]] = llama_cpp_probe,
                 jtop: Callable[[], Any] = jtop_client,
                 llama_system_info: Callable[[], str] = llama_cpp_system_info) -> None:
        self.config = config
        self.model_dir = model_dir
        self.root = root
        self.find_library = find_library
        self.llama_probe = llama_probe
        self.jtop_client = jtop
        self.llama_system_info = llama_system_info

    def run(self) -> list[Check]:
        checks: list[Callable[[], Check]] = [
            self.platform, self.cpu, self.nvidia_driver, self.cuda_libraries, self.onnxruntime, self.llama_cpp,
            self.jtop, self.sensors, self.cameras, self.broker, self.line_io, self.disk, self.bundle]
        out = []
        for check in checks:
            try:
                out.append(check())
            except Exception as exc:  # noqa: BLE001 - a broken check is itself a finding
                out.append(Check(check.__name__, "fail", f"the check crashed: {exc}", "report this as a bug"))
        return out

    # ---- platform ----------------------------------------------------------------------------

    def jetson_release(self) -> tuple[str | None, str | None]:
        """(L4T release like '36.3.0', board model) from the system files, or Nones off-Jetson."""
        release = model = None
        text = _read(self.root / "etc/nv_tegra_release")
        if text:
            m = re.search(r"R(\d+) \(release\), REVISION: ([\d.]+)", text)
            if m:
                release = f"{m.group(1)}.{m.group(2)}"
        raw = _read(self.root / "proc/device-tree/model")
        if raw:
            model = raw.strip("\x00 \n")
        return release, model

    def platform(self) -> Check:
        release, model = self.jetson_release()
        if release:
            jetpack = JETPACK.get(".".join(release.split(".")[:2]), "unknown")
            return Check("platform", "ok", f"{model or 'Jetson'}, L4T {release} (JetPack {jetpack})")
        return Check("platform", "ok", f"{platform.machine()} {platform.system()} {platform.release()} "
                     f"({model or 'not a Jetson'})")

    def cpu(self) -> Check:
        info = read_cpuinfo(self.root)
        if info is None:
            return Check("cpu", "skip", "/proc/cpuinfo lists no processor")
        built = [f for f in compiled_cpu_features(self.llama_system_info()) if f in CPU_FEATURES]
        detail = f"{info.describe()}; llama.cpp's CPU backend built for {', '.join(built) or 'the baseline'}"
        missing = [f"{f} ({CPU_FEATURES[f]})" for f in built if CPU_FEATURES[f] not in info.features]
        if missing:
            return Check("cpu", "fail", f"{detail}; this CPU lacks {', '.join(missing)}: the first inference would "
                         "die with an illegal instruction",
                         "install a llama-cpp-python built for this CPU: pip builds one on the device itself, or "
                         "cross-build with build/arm64/llama_wheel.sh --arch naming only what this CPU has")
        return Check("cpu", "ok", detail)

    def nvidia_driver(self) -> Check:
        version = _read(self.root / "proc/driver/nvidia/version")
        release, _ = self.jetson_release()
        if version:
            return Check("nvidia driver", "ok", version.splitlines()[0].strip())
        if release:
            return Check("nvidia driver", "ok", "Jetson integrated GPU (driver is part of L4T)")
        wants_gpu = self.config.model.gpu_layers != 0
        return Check("nvidia driver", "fail" if wants_gpu else "skip", "no NVIDIA driver loaded",
                     "install the NVIDIA driver or set model.gpu_layers: 0 to run on the CPU" if wants_gpu else "")

    def cuda_libraries(self) -> Check:
        found = {lib: self.find_library(lib) for lib in ("cuda", "cudart", "cublas")}
        present = [k for k, v in found.items() if v]
        if len(present) == len(found):
            return Check("cuda libraries", "ok", ", ".join(f"{k}: {v}" for k, v in found.items()))
        gpu_machine = _read(self.root / "proc/driver/nvidia/version") or self.jetson_release()[0]
        if not present or not gpu_machine:
            return Check("cuda libraries", "skip", f"CPU-only machine (found: {', '.join(present) or 'none'})")
        missing = sorted(set(found) - set(present))
        return Check("cuda libraries", "warn", f"found {', '.join(present)}; missing {', '.join(missing)}",
                     "install the CUDA runtime matching your llama.cpp/ONNX Runtime builds (JetPack ships it)")

    # ---- engines -------------------------------------------------------------------------------

    def onnxruntime(self) -> Check:
        dists = {d.metadata["Name"].lower() for d in importlib.metadata.distributions()
                 if d.metadata["Name"] and d.metadata["Name"].lower().startswith("onnxruntime")}
        if {"onnxruntime", "onnxruntime-gpu"} <= dists:
            return Check("onnxruntime", "fail", "both onnxruntime and onnxruntime-gpu are installed",
                         "pip uninstall -y onnxruntime onnxruntime-gpu, then install only the one you need")
        import onnxruntime as ort

        available = ort.get_available_providers()
        wanted = self.config.model.providers
        missing = [p for p in wanted if p not in available]
        detail = f"{ort.__version__}; available {', '.join(available)}"
        if missing:
            detail += f"; configured but missing {', '.join(missing)} (falls back to CPU)"
        if missing and self.config.model.gpu_layers != 0:
            return Check("onnxruntime", "warn", detail,
                         "install onnxruntime-gpu (on Jetson from NVIDIA's JetPack wheel index) for GPU encoding")
        return Check("onnxruntime", "ok", detail)

    def llama_cpp(self) -> Check:
        version, gpu = self.llama_probe()
        detail = f"llama-cpp-python {version}, GPU offload {'built in' if gpu else 'not built'}"
        if self.config.model.gpu_layers != 0 and not gpu:
            return Check("llama.cpp", "fail", detail + f"; model.gpu_layers is {self.config.model.gpu_layers}",
                         "install the CUDA wheel from build/llama_cpp_cuda.sh or set model.gpu_layers: 0")
        return Check("llama.cpp", "ok", detail)

    # ---- devices -------------------------------------------------------------------------------

    def jtop(self) -> Check:
        release, _ = self.jetson_release()
        if not release:
            return Check("jtop", "skip", "not a Jetson")
        sock = self.root / "run/jtop.sock"
        if not sock.exists():
            return Check("jtop", "fail", "the jtop service socket /run/jtop.sock is missing",
                         "sudo systemctl enable --now jtop (in a container, mount /run/jtop.sock)")
        try:
            with self.jtop_client() as j:
                return Check("jtop", "ok", f"service answers; board {j.board.get('hardware', {}).get('Model', '?')}")
        except Exception as exc:  # noqa: BLE001 - jtop raises JtopException for version mismatch etc.
            return Check("jtop", "fail", f"jtop client error: {exc}",
                         "install the same jetson-stats version as the host service (pip show jetson-stats)")

    def sensors(self) -> Check:
        from edge_runtime.power.sensors import detect_sensor

        g = self.config.governor
        if not g.enabled:
            return Check("sensors", "skip", "governor disabled")
        try:
            sensor = detect_sensor(g.sensor, g.replay_file, sysfs_root=self.root)
        except (RuntimeError, ValueError) as exc:
            return Check("sensors", "fail", str(exc), "set governor.sensor: auto, or fix the named backend")
        snap = sensor.read()
        sensor.close()
        if sensor.name == "none":
            status = "warn" if g.max_power_w or g.max_temp_c else "skip"
            return Check("sensors", status, "no temperature or power sensors readable",
                         "the budget cannot be enforced without sensors; check /sys/class/thermal permissions"
                         if status == "warn" else "")
        return Check("sensors", "ok" if not snap.error else "fail",
                     f"{sensor.name}: {len(snap.temperatures)} temperatures, "
                     f"power {snap.total_power_w if snap.total_power_w is not None else 'n/a'} W"
                     + (f"; error {snap.error}" if snap.error else ""),
                     "restart the sensor service (jtop) or check driver permissions" if snap.error else "")

    def cameras(self) -> Check:
        from edge_runtime.capture.sources import source_kind

        if not self.config.cameras:
            return Check("cameras", "skip", "no cameras configured")
        problems, seen = [], []
        for cam in self.config.cameras:
            kind = source_kind(cam)
            src = str(cam.source)
            if kind == "v4l2":
                dev = Path(f"/dev/video{src}" if src.isdigit() else src)
                here = self.root / dev.relative_to("/") if dev.is_absolute() else dev
                if not here.exists():
                    problems.append(f"{cam.name}: {dev} does not exist")
                elif not os.access(here, os.R_OK | os.W_OK):
                    problems.append(f"{cam.name}: no permission on {dev} (add the user to group video)")
            elif kind in ("image", "folder", "video") and not Path(src.removeprefix("file://")).exists():
                problems.append(f"{cam.name}: {src} does not exist")
            elif kind in ("rtsp", "http"):
                m = re.match(r"\w+://(?:[^@/]+@)?([^:/]+)(?::(\d+))?", src)
                if m:
                    port = int(m.group(2) or (554 if kind == "rtsp" else 80))
                    if not _reachable(m.group(1), port):
                        problems.append(f"{cam.name}: {m.group(1)}:{port} is not reachable")
            seen.append(f"{cam.name} ({kind})")
        if problems:
            return Check("cameras", "fail", "; ".join(problems),
                         "fix the camera's source in the config, its cable or its network")
        return Check("cameras", "ok", ", ".join(seen))

    def broker(self) -> Check:
        m = self.config.mqtt
        if not m.enabled:
            return Check("mqtt broker", "skip", "MQTT disabled")
        if _reachable(m.host, m.port):
            return Check("mqtt broker", "ok", f"{m.host}:{m.port} accepts connections")
        return Check("mqtt broker", "fail", f"{m.host}:{m.port} is not reachable",
                     "start the broker or set mqtt.host/mqtt.port (results wait in the journal meanwhile)")

    def line_io(self) -> Check:
        from edge_runtime.lineio.doctor import line_io_findings

        status, detail, fix = line_io_findings(self.config)
        return Check("line i/o", status, detail, fix)

    def disk(self) -> Check:
        path = self.config.journal_path().parent
        path.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path).free / 1e9
        detail = f"{free:.1f} GB free at {path}"
        if free < 0.1:
            return Check("disk", "fail", detail, "free space or move data_dir: the journal cannot grow")
        if free < 1:
            return Check("disk", "warn", detail, "free space or lower journal.max_rows")
        return Check("disk", "ok", detail)

    def bundle(self) -> Check:
        from edge_runtime.core.bundle.manifest import demo_bundle_dir, load_bundle
        from edge_runtime.core.errors import BundleError

        path = self.model_dir or self.config.model.path or demo_bundle_dir(self.config.data_dir)
        try:
            b = load_bundle(path)
        except BundleError as exc:
            fix = ("run: edge-runtime models demo" if not (self.model_dir or self.config.model.path)
                   else "copy the bundle again (edge-runtime models verify DIR checks it)")
            return Check("model bundle", "fail", str(exc), fix)
        if b.kind == "mmproj":  # a GGUF + mmproj pair (format 2) has no ONNX encoder
            d = b.describe()
            return Check("model bundle", "ok", f"{b.name} at {b.root}: {d['files']['language']} "
                         f"({d['quantization'] or 'GGUF'}) + {d['files']['mmproj']} ({d['projector']}), "
                         f"image_max_tokens {d['image_max_tokens']}: checksums, headers and fit match")
        return Check("model bundle", "ok", f"{b.name} at {b.root}: checksums and widths match")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def render_table(checks: list[Check]) -> str:
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "-   "}
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{marks[c.status]}  {c.name.ljust(width)}  {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"{' ' * (8 + width)}fix: {c.fix}")
    failed = sum(c.status == "fail" for c in checks)
    lines.append(f"\n{failed} failed, {sum(c.status == 'warn' for c in checks)} warnings")
    return "\n".join(lines)


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [asdict(c) for c in checks]

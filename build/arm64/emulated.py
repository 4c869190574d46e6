"""The daemon's own commands on aarch64 code: the arm64 tree's python3 under qemu-user, with the aarch64
wheels on PYTHONPATH. Each check returns a one-line finding or raises `Failed` with what it saw.

qemu-user 7.2 shows the guest the host's /proc/cpuinfo (x86 text), on which ONNX Runtime's cpuinfo
library crashes at import; `qemu-aarch64 -L TREE` opens TREE/proc/cpuinfo instead when that file exists,
so `orin_cpuinfo` writes one in the Jetson Orin's format there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

# The nearest core qemu 7.2 models to the Orin's Cortex-A78AE: Armv8.2-A with dot product and FP16, no
# SVE, no i8mm. An instruction beyond what the A78AE has (the build's -march) faults here.
QEMU_CPU = "cortex-a76"
# /proc/cpuinfo as an Orin's kernel writes it (no "model name" on aarch64; the core is implementer 0x41
# part 0xd42, Cortex-A78AE); the Features are the Armv8.2 set of the Cortex-A78 family.
_ORIN_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"


class Failed(RuntimeError):
    """A check that did not pass, with what the command printed."""


def orin_cpuinfo(cores: int = 2) -> str:
    return "\n".join(f"processor\t: {i}\nBogoMIPS\t: 62.50\nFeatures\t: {_ORIN_FEATURES}\nCPU implementer\t: 0x41\n"
                     "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd42\nCPU revision\t: 1\n"
                     for i in range(cores))


class Emulator:
    """Runs the tree's python3 under qemu-aarch64 with `paths` on PYTHONPATH and `home` as its home."""

    def __init__(self, tree: Path, paths: list[Path], home: Path) -> None:
        self.tree = tree
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": ":".join(map(str, paths)),
                    "QEMU_CPU": QEMU_CPU, "EDGE_RUNTIME_DATA": str(home / "data"), "LANG": "C.UTF-8"}
        self.home = home
        (tree / "proc").mkdir(exist_ok=True)
        (tree / "proc/cpuinfo").write_text(orin_cpuinfo(os.cpu_count() or 2))

    def argv(self, *args: str) -> list[str]:
        return ["qemu-aarch64", "-L", str(self.tree), str(self.tree / "usr/bin/python3"), *args]

    def run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                                  env=self.env, cwd=self.home)
        except subprocess.TimeoutExpired as exc:
            raise Failed(f"{' '.join(args[:4])}: no answer within {timeout:.0f} s") from exc

    def cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """`edge-runtime ARGS` (python -m edge_runtime), which must exit 0."""
        proc = self.run("-m", "edge_runtime", *args, timeout=timeout)
        if proc.returncode != 0:
            raise Failed(f"edge-runtime {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc


def check_imports(emu: Emulator, resolve_py: Path, site: list[Path]) -> str:
    """The engines load as aarch64 code, and every installed requirement is met (markers as on aarch64)."""
    probe = ("import platform, llama_cpp, onnxruntime, cv2, numpy, edge_runtime\n"
             "info = llama_cpp.llama_print_system_info().decode()\n"
             "print(platform.machine(), llama_cpp.__version__, onnxruntime.__version__, cv2.__version__, '|', info)")
    proc = emu.run("-c", probe, timeout=900)
    if proc.returncode != 0 or not proc.stdout.startswith("aarch64 "):
        raise Failed(f"importing the engines failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = proc.stdout.strip().splitlines()[-1]
    if "DOTPROD = 1" not in line:
        raise Failed(f"llama.cpp runs without the dot-product kernels the Orin build asks for: {line}")
    checked = emu.run(str(resolve_py), "--check-installed", *map(str, site), timeout=900)
    if checked.returncode != 0:
        raise Failed(f"requirements not met on aarch64:\n{checked.stdout}{checked.stderr[-2000:]}")
    swept = emu.run("-c", _SWEEP, timeout=900)
    if swept.returncode != 0:
        raise Failed(f"modules that do not import on aarch64:\n{swept.stdout}{swept.stderr[-3000:]}")
    return f"{line}; {checked.stdout.strip()}; {swept.stdout.strip()}"


# Every module of the package imported as aarch64 code (the steps after this one reach only the inference
# path; OTA, line I/O, the API are imported here). A module may miss only the eval extra's packages, which
# the daemon's set leaves out (pyproject.toml: "Not needed by the daemon").
_EVAL_ONLY = ("scipy", "sklearn", "matplotlib")
_SWEEP = f"""
import importlib, pkgutil, sys
import edge_runtime
names = [m.name for m in pkgutil.walk_packages(edge_runtime.__path__, 'edge_runtime.')
         if m.name != 'edge_runtime.__main__']  # __main__ would run the CLI
bad, eval_only = [], []
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        (eval_only if (exc.name or '').split('.')[0] in {_EVAL_ONLY!r} else bad).append(f'{{name}}: {{exc!r}}')
    except Exception as exc:
        bad.append(f'{{name}}: {{exc!r}}')
print('\\n'.join(bad) if bad else f'{{len(names) - len(eval_only)}} of {{len(names)}} modules import '
      f'({{len(eval_only)}} need the eval extra)')
sys.exit(1 if bad else 0)
"""


def check_doctor(emu: Emulator, config: Path, bundle: Path) -> str:
    proc = emu.run("-m", "edge_runtime", "--config", str(config), "doctor", "--json", "--model", str(bundle),
                   timeout=900)
    try:
        checks = {c["name"]: c for c in json.loads(proc.stdout)}
    except (json.JSONDecodeError, TypeError) as exc:
        raise Failed(f"doctor printed no JSON ({proc.returncode}):\n{proc.stderr[-3000:]}") from exc
    bad = [f"{c['name']}: {c['status']} {c['detail']}" for c in checks.values() if c["status"] == "fail"]
    if bad or proc.returncode != 0:
        raise Failed("doctor found problems:\n" + "\n".join(bad))
    if not checks["platform"]["detail"].startswith("aarch64"):
        raise Failed(f"doctor's platform is {checks['platform']['detail']!r}, not aarch64")
    return f"0 failed; {checks['platform']['detail']}; cpu: {checks['cpu']['detail']}"


def valid_verdict(result: dict[str, Any], schema: dict[str, Any]) -> str:
    """The result's verdict against the bundle's schema (the host's jsonschema)."""
    from jsonschema import Draft202012Validator

    errors = [e.message for e in Draft202012Validator(schema).iter_errors(result.get("verdict"))]
    if errors:
        raise Failed(f"the verdict {result.get('verdict')!r} breaks the bundle's schema: {errors[:3]}")
    return json.dumps(result["verdict"], separators=(",", ":"))


def check_infer(emu: Emulator, image: Path, bundle: Path, schema: dict[str, Any]) -> str:
    proc = emu.cli("infer", str(image), "--model", str(bundle), "--no-warmup", timeout=1800)
    result = json.loads(proc.stdout)
    timings = result.get("timings_ms", {})
    return f"{valid_verdict(result, schema)} in {timings.get('total', sum(timings.values())):.0f} ms (emulated)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, data_dir: Path, port: int) -> Path:
    path.write_text(f"device_id: arm64-emulated\ndata_dir: {data_dir}\napi: {{host: 127.0.0.1, port: {port}}}\n"
                    "mqtt: {enabled: false}\n")
    return path


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def check_run_demo(emu: Emulator, config: Path, port: int, schema: dict[str, Any], log: Path,
                   timeout: float = 1800) -> str:
    """`run --demo` until /readyz answers and the journal holds a schema-valid verdict; then SIGTERM, which
    must end the daemon cleanly (exit 0) as systemd's stop does."""
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(emu.argv("-m", "edge_runtime", "--config", str(config), "run", "--demo"),
                                stdout=out, stderr=subprocess.STDOUT, env=emu.env, cwd=emu.home)
    try:
        found = _wait_for_verdict(proc, base, schema, started, timeout, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise Failed(f"run --demo exited {proc.returncode} on SIGTERM:\n{log.read_text()[-3000:]}")
    return f"{found}; SIGTERM -> exit 0"


def _wait_for_verdict(proc: subprocess.Popen[bytes], base: str, schema: dict[str, Any], started: float,
                      timeout: float, log: Path) -> str:
    ready_s = None
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise Failed(f"run --demo exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if ready_s is None and _get(base + "/readyz").get("ready"):
                ready_s = time.monotonic() - started
            if ready_s is not None:
                results = _get(base + "/api/v1/results?limit=1").get("results") or []
                if results:
                    verdict = valid_verdict(results[0], schema)
                    return (f"/readyz after {ready_s:.0f} s, first journaled verdict after "
                            f"{time.monotonic() - started:.0f} s: {verdict}")
        except OSError:
            pass  # not listening yet, or /readyz still 503
        time.sleep(2)
    raise Failed(f"no journaled verdict within {timeout:.0f} s (ready after {ready_s} s):\n{log.read_text()[-3000:]}")

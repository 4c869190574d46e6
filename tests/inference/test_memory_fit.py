"""A bundle and settings that cannot fit the device's memory are refused at load with the figures, before
anything is allocated; real configurations (the demo) still load. The figures come from the files'
headers; the free memory from /proc/meminfo and the cgroup limits (a fake tree only for a limit this
machine does not have) or NVML."""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.core.errors import BundleError, ConfigError
from edge_runtime.core.images import decode_image
from edge_runtime.core.samples import part_image
from edge_runtime.inference.memory_fit import HostMemory, check_fit, host_memory, need_of
from edge_runtime.inference.model_source import open_inspector
from tests.support.images import encode
from tests.support.tiny_pairs import TinyPair, write_pair_bundle

GiB = 2**30


def deepened(demo: Path, dest: Path, layers: int) -> Path:
    """The demo bundle whose language GGUF declares `layers` blocks (its tensors stay the demo's two, so
    llama.cpp would refuse to load it: nothing of it is ever allocated, with or without the check)."""
    shutil.copytree(demo, dest)
    gguf = dest / "language.gguf"
    data = bytearray(gguf.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF value type UINT32
    struct.pack_into("<I", data, at + 4, layers)
    gguf.write_bytes(bytes(data))
    manifest = dest / "bundle.yaml"
    old = hashlib.sha256((demo / "language.gguf").read_bytes()).hexdigest()
    manifest.write_text(manifest.read_text().replace(old, hashlib.sha256(data).hexdigest()))
    return dest


def test_a_context_whose_kv_cannot_fit_is_refused_at_start_with_the_figures_before_allocating(
        tmp_path: Path, demo_dir: Path) -> None:
    bundle = deepened(demo_dir, tmp_path / "deep", layers=200)  # 200 x 256 B of KV a token
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"data_dir: {tmp_path / 'data'}\nmodel: {{path: {bundle}, context_size: 131072, threads: 2}}\n"
                   "api: {enabled: false}\nmqtt: {enabled: false}\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run"],
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    errors = [line for line in proc.stderr.splitlines() if line.startswith("edge-runtime: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = errors[0]
    # 655,360 cells (1 + 4 slots of 131072) x 51,200 B = 31.2 GiB: more than this 24 GiB machine has free
    assert "edge-demo-vlm@1.0 does not fit this device's memory:" in line and "must be free in RAM but" in line
    assert "KV cache 31.2 GiB (model.context_size 131072 tokens x (1 + 4 parallel sequences, " \
           "inspection.max_batch 4) x 50.0 KiB a token at model.kv_cache_type f16)" in line, line
    assert "(MemAvailable)" in line or "cgroup" in line
    assert "Lower model.context_size or inspection.max_batch" in line and "model.memory_check: false" in line
    assert elapsed < 30, elapsed  # the daemon's imports and the bundle's checksums; no model load


def test_the_demo_still_loads_and_its_figures_are_small(tmp_path: Path, demo_dir: Path) -> None:
    config = Config(data_dir=tmp_path)
    config.model.threads = 2
    need = check_fit(load_bundle(demo_dir), config, gpu_offload=False)
    assert need.kv == 5 * 2048 * 512  # 2 layers x 2 KV heads x (32 + 32) x 2 B, 1 + 4 contexts of 2048
    assert need.weights < 2**20 and need.encoder < 64 * 2**20
    inspector = open_inspector(config, str(demo_dir))  # checks the fit, then loads
    try:
        assert inspector.inspect(decode_image(encode(part_image(1), ".jpg")), camera="t").verdict
    finally:
        inspector.close()


def test_a_cgroup_limit_lower_than_ram_is_what_counts(tmp_path: Path, demo_dir: Path) -> None:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text("MemTotal: 25000000 kB\nMemFree: 1000 kB\nMemAvailable: 20000000 kB\n")
    (root / "proc/self/cgroup").write_text("0::/system.slice/edge-runtime.service\n")
    unit = root / "sys/fs/cgroup/system.slice/edge-runtime.service"
    unit.mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpu memory\n")
    (root / "sys/fs/cgroup/system.slice/memory.max").write_text("max\n")
    (unit / "memory.max").write_text(f"{64 * 2**20}\n")  # MemoryMax=64M in the unit
    (unit / "memory.current").write_text(f"{40 * 2**20}\n")
    (unit / "memory.stat").write_text(f"anon 1\nactive_file {2**20}\ninactive_file {2**20}\n")
    host = host_memory(root)
    assert host.available == 26 * 2**20 and host.total == 64 * 2**20 and "cgroup memory.max" in host.source
    with pytest.raises(ConfigError, match=r"must be free in RAM but 26 MiB is \(cgroup memory.max of .*"
                                          r"edge-runtime.service\)"):
        check_fit(load_bundle(demo_dir), Config(), gpu_offload=False, host=host)
    (unit / "memory.max").write_text("max\n")
    assert host_memory(root) == HostMemory(20000000 * 1024, 25000000 * 1024, "MemAvailable")


def test_cgroup_v1_limits_are_read_and_no_limit_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 6000000 kB\n")
    (root / "proc/self/cgroup").write_text("5:memory:/docker/abc\n1:cpu:/\n")
    group = root / "sys/fs/cgroup/memory/docker/abc"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(f"{GiB}\n")
    (group / "memory.usage_in_bytes").write_text(f"{GiB // 2}\n")
    (group / "memory.stat").write_text(f"cache 5\ntotal_inactive_file {GiB // 4}\ntotal_active_file 0\n")
    assert host_memory(root).available == GiB // 2 + GiB // 4
    (group / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert host_memory(root).source == "MemAvailable"
    assert host_memory().available > 0  # this machine's own files parse


def test_layers_on_a_gpu_count_against_its_free_memory_or_the_ram_of_a_jetson(tmp_path: Path,
                                                                             demo_dir: Path) -> None:
    bundle = load_bundle(deepened(demo_dir, tmp_path / "deep", layers=200))
    config = Config()
    config.model.context_size, config.model.gpu_layers = 8192, -1
    plenty = HostMemory(20 * GiB, 24 * GiB, "MemAvailable")
    need = need_of(bundle, config, gpu_offload=True)
    assert need.gpu_share == 1.0 and need.kv == 40960 * 51200 and need.on_gpu() > need.kv  # (1 + 4) x 8192 cells
    with pytest.raises(ConfigError, match=r"must be free on the GPU \(model.gpu_layers -1\) but 1.0 GiB is \(NVML\)"):
        check_fit(bundle, config, gpu_offload=True, host=plenty, gpu=GiB, unified=False)
    check_fit(bundle, config, gpu_offload=True, host=plenty, gpu=8 * GiB, unified=False)
    with pytest.raises(ConfigError, match="must be free in RAM"):  # a Jetson: the GPU's memory is the RAM
        check_fit(bundle, config, gpu_offload=True, host=HostMemory(GiB, 8 * GiB, "MemAvailable"), unified=True)
    # Without a GPU build llama.cpp keeps every layer on the CPU: all of it is host memory.
    assert need_of(bundle, config, gpu_offload=False).on_gpu() == 0


def test_mapped_weights_need_room_in_ram_not_free_memory(demo_dir: Path) -> None:
    bundle = load_bundle(demo_dir)
    tight = HostMemory(available=200 * 2**20, total=40 * 2**20, source="MemAvailable")  # a 40 MiB device
    with pytest.raises(ConfigError, match=r"RAM is needed \(the mapped weights included\) but the device has 40 MiB"):
        check_fit(bundle, Config(), gpu_offload=False, host=tight)


def test_a_header_declaring_absurd_layers_is_a_bundle_error_not_a_huge_list(tmp_path: Path, demo_dir: Path) -> None:
    bundle = load_bundle(deepened(demo_dir, tmp_path / "deep", layers=4_000_000_000))
    with pytest.raises(BundleError, match="block_count 4000000000 is not a model's"):
        need_of(bundle, Config(), gpu_offload=False)


def test_encoder_lanes_count_the_mmproj_once_each_and_the_refusal_names_them(
        tmp_path: Path, demo_dir: Path, tiny_pairs: Callable[[str], TinyPair]) -> None:
    """model.encoder_lanes 4 on a GGUF + mmproj bundle: four encoders' worth, and a refusal says the
    lanes multiplied it and that lowering them helps; an ONNX bundle's one session is counted once."""
    pair = load_bundle(write_pair_bundle(tiny_pairs("qwen2.5-vl"), tmp_path / "pair"))
    one, four = Config(), Config()
    four.model.encoder_lanes = 4
    assert need_of(pair, four, gpu_offload=False).encoder == 4 * need_of(pair, one, gpu_offload=False).encoder
    demo = load_bundle(demo_dir)
    assert need_of(demo, four, gpu_offload=False).encoder == need_of(demo, one, gpu_offload=False).encoder
    tight = HostMemory(available=100 * 2**20, total=8 * GiB, source="MemAvailable")
    with pytest.raises(ConfigError) as refused:
        check_fit(pair, four, gpu_offload=False, host=tight)
    assert re.search(r"encoder [\d.]+ MiB \(model.encoder_lanes 4 x [\d.]+ MiB\)", str(refused.value)), \
        str(refused.value)
    assert "Lower model.context_size, inspection.max_batch or model.encoder_lanes" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        check_fit(pair, one, gpu_offload=False, host=HostMemory(10 * 2**20, 8 * GiB, "MemAvailable"))
    assert "encoder_lanes" not in str(refused.value), str(refused.value)

"""The CLI end to end in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from edge_runtime.core.samples import part_image
from tests.support.hostile import heic
from tests.support.images import encode


def run_cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_RUNTIME_DATA": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "edge_runtime", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp"])
def test_infer_prints_a_valid_result(ext: str, tmp_path: Path, data_dir: Path, demo_dir: Path) -> None:
    image = tmp_path / f"part{ext}"
    image.write_bytes(encode(part_image(4, defect=True), ext))
    proc = run_cli("infer", str(image), "--model", str(demo_dir), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    manifest_schema = __import__("yaml").safe_load((demo_dir / "bundle.yaml").read_text())["verdict_schema"]
    jsonschema.validate(result["verdict"], manifest_schema)
    assert result["frame"]["width"] == 640 and result["model"] == "edge-demo-vlm@1.0"


def test_infer_reads_a_heic_phone_photo(tmp_path: Path, data_dir: Path, demo_dir: Path) -> None:
    image = tmp_path / "IMG_0042.HEIC"
    image.write_bytes(heic(part_image(4, defect=True)))
    proc = run_cli("infer", str(image), "--model", str(demo_dir), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    frame = json.loads(proc.stdout)["frame"]
    assert (frame["width"], frame["height"]) == (640, 480)


def test_infer_builds_the_demo_bundle_when_none_is_given(tmp_path: Path) -> None:
    image = tmp_path / "part.bmp"
    image.write_bytes(encode(part_image(5), ".bmp"))
    proc = run_cli("infer", str(image), data_dir=tmp_path / "fresh")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fresh" / "models" / "demo" / "bundle.yaml").is_file()


@pytest.mark.parametrize(("make_input", "message"), [
    (lambda d: d / "missing.jpg", "no such file"),
    (lambda d: (d / "notes.txt").write_text("just text") and d / "notes.txt", "not an image"),
    (lambda d: (d / "cut.jpg").write_bytes(encode(part_image(0), ".jpg")[:2500]) and d / "cut.jpg", "truncated"),
])
def test_bad_images_give_one_line_and_exit_2(make_input, message: str, tmp_path: Path,
                                            data_dir: Path) -> None:
    proc = run_cli("infer", str(make_input(tmp_path)), data_dir=data_dir)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_corrupt_bundle_gives_one_line_and_exit_2(tmp_path: Path, data_dir: Path, bundle_copy: Path) -> None:
    (bundle_copy / "vision.onnx").write_bytes(b"broken")
    image = tmp_path / "p.png"
    image.write_bytes(encode(part_image(1), ".png"))
    proc = run_cli("infer", str(image), "--model", str(bundle_copy), data_dir=data_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "vision.onnx does not match its sha256" in proc.stderr


def test_config_validate_reports_the_bad_line(tmp_path: Path, data_dir: Path) -> None:
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("model:\n  threads: 2\n  providers: [CPUExecutionProvider]\n  temprature: 0.1\n")
    proc = run_cli("config", "validate", str(cfg), data_dir=data_dir)
    assert proc.returncode == 2
    assert f"{cfg}:4: model.temprature: unknown key" in proc.stderr
    cfg.write_text("model:\n  threads: 2\n")
    assert run_cli("config", "validate", str(cfg), data_dir=data_dir).returncode == 0


def test_config_schema_is_json_schema(data_dir: Path) -> None:
    proc = run_cli("config", "schema", data_dir=data_dir)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["properties"]["model"]


def test_models_demo_and_verify(tmp_path: Path, data_dir: Path) -> None:
    proc = run_cli("models", "demo", str(tmp_path / "b"), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("models", "verify", "--json", str(tmp_path / "b"), data_dir=data_dir)
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] is True
    proc = run_cli("models", "demo", str(tmp_path / "b"), data_dir=data_dir)  # a bundle folder: replaced
    assert proc.returncode == 0, proc.stderr


def test_models_demo_refuses_to_replace_a_folder_of_other_files(tmp_path: Path, data_dir: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.txt").write_text("years of work")
    proc = run_cli("models", "demo", str(home), data_dir=data_dir)
    assert proc.returncode == 2 and "not empty and is not a bundle folder" in proc.stderr
    assert (home / "thesis.txt").read_text() == "years of work"
    assert not list(tmp_path.glob(".bundle-*"))  # refused before any work folder was made


# ---- usage, global options, data dir, stopping -----------------------------------------------

def test_config_after_the_command_is_read_as_before_it(tmp_path: Path, data_dir: Path) -> None:
    """The README's `edge-runtime run --config FILE` form: the file is loaded (and here refused)."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("modle: {}\n")
    for args in (["run", "--config", str(cfg)], ["--config", str(cfg), "run"], ["doctor", "-c", str(cfg)]):
        proc = run_cli(*args, data_dir=data_dir)
        assert proc.returncode == 2, args
        assert proc.stderr.strip().startswith(f"edge-runtime: error: {cfg}:1: modle: unknown key"), args


@pytest.mark.parametrize("args", [["run", "--bogus"], [], ["infer"], ["models", "demo", "--quant", "Q9"]])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], data_dir: Path) -> None:
    proc = run_cli(*args, data_dir=data_dir)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "--help" in lines[0], proc.stderr


def test_data_dir_flag_chooses_where_the_demo_bundle_lives(tmp_path: Path) -> None:
    """--data-dir wins over $EDGE_RUNTIME_DATA (run_cli points that at `env`), before or after the command."""
    for where, args in (("after", ["models", "demo", "--data-dir"]), ("before", ["--data-dir"])):
        target = tmp_path / where
        argv = [*args, str(target)] + (["models", "demo"] if where == "before" else [])
        proc = run_cli(*argv, data_dir=tmp_path / "env")
        assert proc.returncode == 0, proc.stderr
        assert (target / "models" / "demo" / "bundle.yaml").is_file()
    assert not (tmp_path / "env").exists()


def demo_daemon(tmp_path: Path, demo_dir: Path, mqtt: str = "mqtt:\n  enabled: false\n") -> tuple[
        subprocess.Popen[str], int]:
    from tests.support.mjpeg import free_port

    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"api:\n  port: {port}\n{mqtt}model:\n  threads: 2\n")
    proc = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(cfg), "run", "--demo", "--model",
                             str(demo_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path / "data")})
    return proc, port


def wait_ready(port: int, proc: subprocess.Popen[str]) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the daemon did not get ready")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_stop_run_with_exit_0_and_no_warning(sig: str, tmp_path: Path, demo_dir: Path) -> None:
    import signal

    proc, port = demo_daemon(tmp_path, demo_dir)
    try:
        wait_ready(port, proc)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, err
    assert "Traceback" not in err and " WARNING " not in err and " ERROR " not in err, err
    assert "daemon: stopped" in err


def test_sigterm_while_starting_up_exits_0_without_a_traceback(tmp_path: Path, demo_dir: Path) -> None:
    import signal
    import time

    proc, _ = demo_daemon(tmp_path, demo_dir)
    try:
        # `run` imports the daemon's engines (ONNX Runtime first) before it serves: signal as soon as
        # that library is mapped, i.e. while the command is starting up, before run_forever.
        maps = Path(f"/proc/{proc.pid}/maps")
        deadline = time.monotonic() + 60
        while "onnxruntime" not in maps.read_text() and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def test_ctrl_c_with_a_broker_logs_no_warning(tmp_path: Path, demo_dir: Path) -> None:
    import signal

    from tests.support.broker import Broker

    broker = Broker(tmp_path / "broker").start()
    try:
        proc, port = demo_daemon(tmp_path, demo_dir, f"mqtt:\n  host: 127.0.0.1\n  port: {broker.port}\n")
        try:
            wait_ready(port, proc)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill() if proc.poll() is None else None
    finally:
        broker.stop()
    assert proc.returncode == 0 and " WARNING " not in err, err


def test_ota_sign_carries_the_eval_summary_under_the_signature(tmp_path: Path, data_dir: Path) -> None:
    from edge_runtime.ota.manifest import ManifestRefused, parse, verify

    assert run_cli("ota", "keygen", str(tmp_path / "keys"), data_dir=data_dir).returncode == 0
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"image": "registry.local/edge@sha256:" + "a" * 64, "version": "1.2.0"}))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"images": 200, "variants": [{"escape": {"rate": 0.01}}]}))
    proc = run_cli("ota", "sign", str(manifest), "--key", str(tmp_path / "keys/fleet.key"),
                   "--evaluation", str(summary), data_dir=data_dir)
    assert proc.returncode == 0, proc.stderr
    signed = parse(proc.stdout)
    public = (tmp_path / "keys/fleet.pub").read_text().strip()
    assert signed.evaluation == {"images": 200, "variants": [{"escape": {"rate": 0.01}}]}
    verify(signed, [public], "1.0.0", "0.1.0")  # the summary is under the signature
    forged = signed.model_copy(update={"evaluation": {"images": 200, "variants": [{"escape": {"rate": 0.0}}]}})
    with pytest.raises(ManifestRefused):
        verify(forged, [public], "1.0.0", "0.1.0")
    summary.write_text(json.dumps({"notes": "x" * 20_000}))
    big = run_cli("ota", "sign", str(manifest), "--key", str(tmp_path / "keys/fleet.key"),
                  "--evaluation", str(summary), data_dir=data_dir)
    assert big.returncode == 2 and "larger than 16 KiB" in big.stderr

"""A fleet of device agents against a real DDI server (`make test-ota`; root, Docker, a registry).

goosebit (PyPI; Eclipse hawkBit cannot be fetched here, docs/decisions.md) serves hawkBit's DDI API
with device tokens (strict auth). Each device is its own container (FROM scratch, busybox httpd
serving /readyz, `--network none`) with its own data directory and its own `edge-runtime ota agent`
process, all on one Docker engine and one local registry. The scenarios run in file order on one
fleet: a rollout in 3 waves, a release that never turns healthy, a cancel mid-wave, a kill -9 mid-update.
Figures (wall time per wave, DDI requests per device per minute at idle) go to
test-artifacts/ota-fleet.json.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

docker = pytest.importorskip("docker")

from edge_runtime.lineio.ota_lock import LineJobsLock  # noqa: E402
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign  # noqa: E402
from tests.ota.docker_support import free_port  # noqa: E402
from tests.ota.goosebit import Goosebit, goosebit_python, roll_out, state_of  # noqa: E402
from tests.ota.test_update_lock import signals  # noqa: E402

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
DEVICES = int(os.environ.get("EDGE_FLEET_DEVICES", "20"))
ROOT = Path(__file__).resolve().parents[2]
FIGURES: dict[str, Any] = {}


def build(engine: Any, registry: str, version: str, healthy: bool) -> str:
    """A scratch image serving /readyz on its own loopback (or never); pushed, returns repo@sha256."""
    dockerfile = f"""FROM scratch
COPY busybox /bin/busybox
COPY www /www
LABEL org.opencontainers.image.version="{version}"
STOPSIGNAL SIGKILL
HEALTHCHECK --interval=3s --timeout=2s --start-period=1s --retries=2 \\
  CMD ["/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/readyz"]
CMD ["/bin/busybox", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"]
"""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        members = {"Dockerfile": dockerfile.encode()}
        if healthy:
            members["www/readyz"] = f'{{"ready": true, "version": "{version}"}}'.encode()
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(BUSYBOX, arcname="busybox")
        if not healthy:
            www = tarfile.TarInfo("www")
            www.type = tarfile.DIRTYPE
            tar.addfile(www)
    buf.seek(0)
    repo, tag = f"{registry}/edge-fleet-test", f"v{version}-{uuid.uuid4().hex[:6]}"
    engine.images.build(fileobj=buf, custom_context=True, tag=f"{repo}:{tag}", network_mode="host", rm=True)
    engine.images.push(repo, tag=tag)
    digest = next(d for d in engine.images.get(f"{repo}:{tag}").attrs["RepoDigests"] if d.startswith(repo))
    engine.images.remove(f"{repo}:{tag}", force=True)
    return str(digest)


class Broker:
    """A private mosquitto; `statuses[device]` collects what each agent mirrors to <prefix>/ota/status."""

    def __init__(self, root: Path) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.port = free_port()
        (root / "mosquitto.conf").write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
        self.proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c",
                                      str(root / "mosquitto.conf")], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        self.statuses: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.sub = mqtt.Client(CallbackAPIVersion.VERSION2)
        self.sub.on_message = self._on_message
        self.sub.connect("127.0.0.1", self.port)
        self.sub.subscribe("edge/+/ota/status", qos=1)
        self.sub.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self._lock:
            self.statuses.setdefault(msg.topic.split("/")[1], []).append(json.loads(msg.payload))

    def of(self, device: str, version: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.statuses.get(device, []) if version is None or s.get("version") == version]

    def close(self) -> None:
        self.sub.loop_stop()
        self.sub.disconnect()
        self.proc.terminate()
        self.proc.wait(10)


class Device:
    """One device: its container, data directory, config file and agent process."""

    def __init__(self, root: Path, index: int, run: str, token: str) -> None:
        self.id = f"fleet-{index:02d}"
        self.container = f"edge-fleet-{run}-{index:02d}"
        self.data = root / self.id
        self.data.mkdir()
        self.token = token
        self.agent: subprocess.Popen[bytes] | None = None
        self.lock_file = self.data / "line.lock"

    def write_config(self, gb_url: str, broker_port: int, public_key: str) -> None:
        self.config = self.data / "config.yaml"
        self.config.write_text(json.dumps({
            "device_id": self.id, "data_dir": str(self.data),
            "mqtt": {"host": "127.0.0.1", "port": broker_port},
            "ota": {"container": self.container, "public_keys": [public_key], "health_timeout_s": 60,
                    "lock_file": str(self.lock_file), "lock_max_wait_s": 300,
                    "hawkbit": {"url": gb_url, "tenant": "DEFAULT", "auth": {"target_token": "${FLEET_TOKEN}"}}}}))

    def start_agent(self) -> None:
        log = (self.data / "agent.log").open("ab")
        self.agent = subprocess.Popen([sys.executable, "-m", "edge_runtime", "--config", str(self.config), "ota",
                                       "agent"], stdout=log, stderr=log, env={**os.environ, "FLEET_TOKEN": self.token})
        log.close()

    def stop_agent(self, sig: int = signal.SIGTERM) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(sig)
            try:
                self.agent.wait(20)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(10)
        self.agent = None

    def version(self, engine: Any) -> str:
        running = [c for c in engine.containers.list() if c.name.startswith(self.container)]
        assert [c.name for c in running] == [self.container], f"{self.id}: {[c.name for c in running]}"
        return str(running[0].image.labels["org.opencontainers.image.version"])


def wait_for(what: str, check: Any, timeout: float = 120, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


@pytest.fixture(scope="module")
def fleet(engine: Any, registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = goosebit_python()
    if python is None:
        pytest.skip("goosebit's venv is missing: run `make test-ota` (it makes .venv-goosebit)")
    root = tmp_path_factory.mktemp("fleet")
    private, public = generate_keypair()
    images = {v: build(engine, registry, v, healthy=(v != "3.0.0")) for v in ("1.0.0", "2.0.0", "3.0.0", "4.0.0")}
    engine.images.pull(images["1.0.0"].split("@")[0], tag=images["1.0.0"].split("@")[1])
    gb, broker = Goosebit(python, root), Broker(root)
    run = uuid.uuid4().hex[:6]
    devices = [Device(root, i, run, uuid.uuid4().hex) for i in range(DEVICES)]
    gb.add_devices({d.id: d.token for d in devices})
    for d in devices:
        engine.containers.run(images["1.0.0"], name=d.container, detach=True, network_mode="none")
        d.write_config(gb.url, broker.port, public)
        d.start_agent()
    try:
        yield {"gb": gb, "broker": broker, "devices": devices, "images": images, "private": private, "root": root,
               "engine": engine}
    finally:
        for d in devices:
            d.stop_agent()
        for c in engine.containers.list(all=True):
            if c.name.startswith(f"edge-fleet-{run}-"):
                c.remove(force=True)
        broker.close()
        gb.close()
        out = ROOT / "test-artifacts"
        out.mkdir(exist_ok=True)
        (out / "ota-fleet.json").write_text(json.dumps(FIGURES, indent=2) + "\n")


def upload(fleet: dict[str, Any], version: str) -> int:
    """`edge-runtime ota hawkbit-upload --server goosebit` of a signed manifest for the version's image."""
    manifest = fleet["root"] / f"m-{version}.json"
    manifest.write_text(sign(Manifest(image=fleet["images"][version], version=version), fleet["private"])
                        .model_dump_json(exclude_none=True))
    gb = fleet["gb"]
    done = subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "hawkbit-upload", str(manifest), "--server",
                           "goosebit", "--url", gb.url, "--user", gb.user], capture_output=True, text=True,
                          env={**os.environ, "HAWKBIT_PASSWORD": gb.password}, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["software"])


def waves_of(devices: list[Device]) -> list[list[str]]:
    """10 %, 30 %, the rest."""
    n = len(devices)
    first, second = max(1, n // 10), max(1, (3 * n) // 10)
    ids = [d.id for d in devices]
    return [ids[:first], ids[first:first + second], ids[first + second:]]


def phases(broker: Broker, device: str, version: str) -> list[str]:
    return [s["phase"] for s in broker.of(device, version)]


def test_every_device_registers_with_its_configuration(fleet: dict[str, Any]) -> None:
    gb = fleet["gb"]
    wait_for("every device to send its configData", lambda: all(
        d["sw_version"] == "1.0.0" for d in gb.devices().values()) and len(gb.devices()) == DEVICES, timeout=180)
    start = {d.id: gb.requests_from(d.id) for d in fleet["devices"]}
    time.sleep(30)
    per_minute = [(gb.requests_from(d.id) - start[d.id]) * 2 for d in fleet["devices"]]
    FIGURES["idle_requests_per_device_per_minute"] = {"server_polling_sleep_s": 2, "min": min(per_minute),
                                                      "max": max(per_minute)}
    assert max(per_minute) <= 32  # the server's 2 s sleep is honoured (30 a minute), no more


def test_a_rollout_in_three_waves_commits_on_every_device(fleet: dict[str, Any]) -> None:
    gb, broker, devices = fleet["gb"], fleet["broker"], fleet["devices"]
    software = upload(fleet, "2.0.0")
    waves = roll_out(gb, "r2", "2.0.0", software, waves_of(devices), success_threshold=0.8, error_threshold=0.2)
    assert [w.stopped for w in waves] == [False, False, False]
    wait_for("every device to commit 2.0.0", lambda: all(
        "committed" in phases(broker, d.id, "2.0.0") for d in devices), timeout=240)
    assert {d.version(fleet["engine"]) for d in devices} == {"2.0.0"}
    # Each wave started after the last one passed its threshold: no device of wave n+1 took the release
    # before the first device of wave n had committed it.
    first_seen = {d.id: min(s["ts"] for s in broker.of(d.id, "2.0.0")) for d in devices}
    committed = {d.id: next(s["ts"] for s in broker.of(d.id, "2.0.0") if s["phase"] == "committed") for d in devices}
    for earlier, later in itertools.pairwise(waves):
        assert min(first_seen[i] for i in later.devices) > sorted(committed[i] for i in earlier.devices)[
            int(0.8 * len(earlier.devices)) - 1]
    server = gb.devices()
    assert all(server[d.id]["sw_version"] == "2.0.0" for d in devices)
    FIGURES["rollout_2.0.0"] = [{"wave": w.number, "devices": len(w.devices), "wall_s": w.wall_s,
                                 "success": w.success} for w in waves]


def test_a_release_that_never_turns_healthy_is_stopped_by_the_error_threshold(fleet: dict[str, Any]) -> None:
    gb, broker, devices = fleet["gb"], fleet["broker"], fleet["devices"]
    software = upload(fleet, "3.0.0")
    plan = waves_of(devices)
    waves = roll_out(gb, "r3", "3.0.0", software, plan, success_threshold=0.8, error_threshold=0.2)
    assert len(waves) == 1 and waves[0].stopped  # wave 1 failed past 20 %: waves 2 and 3 never start
    wait_for("wave 1 to roll back", lambda: all("rolled_back" in phases(broker, i, "3.0.0") for i in plan[0])
             and all(state_of(gb.devices()[i]) == "error" for i in plan[0]), timeout=180)
    time.sleep(10)  # five polling intervals: nothing more may reach any device
    for d in devices:
        assert d.version(fleet["engine"]) == "2.0.0"
        seen = phases(broker, d.id, "3.0.0")
        if d.id in plan[0]:
            assert "pulling" in seen and seen[-1] == "rolled_back"
        else:
            assert seen == [], f"{d.id} of a later wave saw 3.0.0: {seen}"  # never pulled
    server = gb.devices()
    assert all(state_of(server[i]) != "error" and server[i]["sw_version"] == "2.0.0" for i in plan[1] + plan[2])
    FIGURES["rollout_3.0.0"] = {"wave_1_wall_s": waves[0].wall_s, "failed": waves[0].failure,
                                "later_waves_started": 0}


def test_a_cancel_mid_wave_is_honoured_by_the_devices_still_waiting(fleet: dict[str, Any]) -> None:
    gb, broker, devices = fleet["gb"], fleet["broker"], fleet["devices"]
    wave = [d for d in devices if d.id in waves_of(devices)[1]]  # healthy on 2.0.0 (wave 1 is in error)
    busy, free = wave[2:], wave[:2]
    lines = [LineJobsLock(d.lock_file) for d in busy]  # their stations have a part in flight
    for line in lines:
        line.changed("press", signals(busy=True))
    try:
        software = upload(fleet, "4.0.0")
        gb.api("PATCH", "/devices", {"devices": [d.id for d in wave], "feed": "r4-cancel"})
        rollout = gb.start_rollout("r4-cancel", "r4-cancel", software)
        wait_for("the free devices to commit and the busy ones to wait for the line", lambda: all(
            state_of(gb.devices()[d.id]) == "finished" and gb.devices()[d.id]["sw_version"] == "4.0.0"
            for d in free) and all("waiting_line" in phases(broker, d.id, "4.0.0") for d in busy), timeout=180)
        gb.pause(rollout)  # goosebit's cancel: the deployment is no longer offered
        wait_for("the waiting devices to cancel", lambda: all(
            phases(broker, d.id, "4.0.0")[-1] == "canceled" for d in busy), timeout=60)
    finally:
        for line in lines:
            line.close()  # the line is idle again
    time.sleep(6)
    for d in busy:
        assert d.version(fleet["engine"]) == "2.0.0" and "starting" not in phases(broker, d.id, "4.0.0")
        assert "withdrawn by the server" in broker.of(d.id, "4.0.0")[-1]["reason"]
    for d in free:
        assert d.version(fleet["engine"]) == "4.0.0"


def test_an_agent_killed_mid_update_converges_and_reports_once(fleet: dict[str, Any]) -> None:
    gb, broker, devices = fleet["gb"], fleet["broker"], fleet["devices"]
    device = devices[-1]  # wave 3: on 2.0.0
    state = device.data / "ota" / "state.json"
    software = next(s["id"] for s in gb.api("GET", "/software")["software"] if s["version"] == "4.0.0")
    gb.api("PATCH", "/devices", {"devices": [device.id], "feed": "r4-kill"})
    rollout = gb.start_rollout("r4-kill", "r4-kill", software)
    wait_for("the candidate to be waiting for its health verdict", lambda: state.exists() and json.loads(
        state.read_text() or "{}").get("phase") == "waiting_health", timeout=120, every=0.05)
    assert device.agent is not None
    device.agent.kill()  # kill -9 mid-update: old container stopped, candidate starting
    device.agent.wait(10)
    device.agent = None
    device.start_agent()
    wait_for("the restarted agent to finish the update", lambda: "committed" in phases(broker, device.id, "4.0.0"),
             timeout=120)
    time.sleep(6)  # three more polls: nothing is reported twice
    assert device.version(fleet["engine"]) == "4.0.0"
    assert phases(broker, device.id, "4.0.0").count("committed") == 1
    server = gb.rollout(rollout)
    assert (server["success_count"], server["failure_count"]) == (1, 0)

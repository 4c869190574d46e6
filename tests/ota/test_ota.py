"""OTA against a real Docker engine and a real local registry (`make test-ota`; needs root).

Images are built FROM scratch around a static busybox: a tiny HTTP server whose /readyz the image's
HEALTHCHECK probes. The "bad" image has no /readyz and never turns healthy.
"""

from __future__ import annotations

import io
import json
import os
import shutil
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

from edge_runtime.ota.agent import OtaAgent  # noqa: E402
from edge_runtime.ota.manifest import Manifest, generate_keypair, sign  # noqa: E402
from tests.ota.docker_support import free_port  # noqa: E402

BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def build_and_push(engine: Any, registry: str, version: str, port: int, healthy: bool) -> str:
    """Build a scratch image serving /readyz (or not) and push it; returns repo@sha256:digest."""
    files = {"Dockerfile": f"""FROM scratch
COPY busybox /bin/busybox
COPY www /www
LABEL org.opencontainers.image.version="{version}"
HEALTHCHECK --interval=1s --timeout=2s --start-period=1s --retries=2 \\
  CMD ["/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:{port}/readyz"]
CMD ["/bin/busybox", "httpd", "-f", "-p", "127.0.0.1:{port}", "-h", "/www"]
"""}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(BUSYBOX, arcname="busybox")
        www = tarfile.TarInfo("www")
        www.type = tarfile.DIRTYPE
        tar.addfile(www)
        if healthy:
            body = f'{{"ready": true, "version": "{version}"}}'.encode()
            info = tarfile.TarInfo("www/readyz")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    buf.seek(0)
    repo = f"{registry}/edge-ota-test"
    tag = f"v{version}-{uuid.uuid4().hex[:6]}"
    engine.images.build(fileobj=buf, custom_context=True, tag=f"{repo}:{tag}", network_mode="host", rm=True)
    engine.images.push(repo, tag=tag)
    digest = next(d for d in engine.images.get(f"{repo}:{tag}").attrs["RepoDigests"] if d.startswith(repo))
    engine.images.remove(f"{repo}:{tag}", force=True)  # the agent must pull it from the registry
    return str(digest)


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return generate_keypair()


@pytest.fixture
def fleet(engine: Any, registry: str, tmp_path: Path, keys: tuple[str, str]) -> Iterator[dict[str, Any]]:
    """A running v1.0.0 container (with env and a bind mount), images v2 (good) and v3 (bad)."""
    port = free_port()
    v1 = build_and_push(engine, registry, "1.0.0", port, healthy=True)
    v2 = build_and_push(engine, registry, "2.0.0", port, healthy=True)
    v3 = build_and_push(engine, registry, "3.0.0", port, healthy=False)
    name = f"edge-ota-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"
    data.mkdir()
    engine.images.pull(v1.split("@")[0], tag=v1.split("@")[1])
    engine.containers.run(v1, name=name, detach=True, network_mode="host", environment={"LINE": "press-7"},
                          volumes={str(data): {"bind": "/data", "mode": "rw"}})
    wait_healthy(engine, name)
    statuses: list[dict[str, Any]] = []
    agent = OtaAgent(engine, name, tmp_path / "state.json", [keys[1]], statuses.append, health_timeout_s=20)
    yield {"engine": engine, "name": name, "v1": v1, "v2": v2, "v3": v3, "agent": agent, "statuses": statuses,
           "port": port, "state": tmp_path / "state.json", "data": data}
    for suffix in ("", "-candidate", "-previous"):
        try:
            engine.containers.get(name + suffix).remove(force=True)
        except docker.errors.NotFound:
            pass


def wait_healthy(engine: Any, name: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = engine.containers.get(name)
        if c.attrs["State"].get("Health", {}).get("Status") == "healthy":
            return
        time.sleep(0.3)
    raise AssertionError(f"{name} did not turn healthy")


@pytest.fixture
def ota_broker(tmp_path: Path) -> Iterator[int]:
    """A private mosquitto for the agent's MQTT side; yields its port."""
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    broker = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    yield port
    broker.terminate()
    broker.wait(10)


def watch_status(port: int, device: str) -> tuple[Any, list[dict[str, Any]]]:
    """Subscribe to a device's OTA status topic; returns the client and the list it fills."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    seen: list[dict[str, Any]] = []
    sub = mqtt.Client(CallbackAPIVersion.VERSION2)
    sub.on_message = lambda _c, _u, m: seen.append(json.loads(m.payload))
    sub.connect("127.0.0.1", port)
    sub.subscribe(f"edge/{device}/ota/status", qos=1)
    sub.loop_start()
    return sub, seen


def start_agent(config: Any) -> tuple[threading.Thread, threading.Event]:
    from edge_runtime.ota.service import run_agent

    stop = threading.Event()
    agent = threading.Thread(target=run_agent, args=(config, stop), daemon=True)
    agent.start()
    return agent, stop


def signed(image: str, version: str, private: str, **extra: Any) -> str:
    return sign(Manifest(image=image, version=version, **extra), private).model_dump_json(exclude_none=True)


def phases(statuses: list[dict[str, Any]]) -> list[str]:
    return [s["phase"] for s in statuses]


def the_one_container(engine: Any, name: str) -> Any:
    """Exactly one container runs under the managed name, it is healthy, and no candidate is left."""
    wait_healthy(engine, name)
    names = [c.name for c in engine.containers.list(all=True) if c.name.startswith(name)]
    assert f"{name}-candidate" not in names
    running = [c for c in engine.containers.list() if c.name.startswith(name)]
    assert [c.name for c in running] == [name]
    return running[0]


def test_healthy_update_commits_with_the_same_configuration(fleet: dict[str, Any], keys: tuple[str, str]) -> None:
    agent, engine, name = fleet["agent"], fleet["engine"], fleet["name"]
    assert agent.handle(signed(fleet["v2"], "2.0.0", keys[0])) == "committed"
    assert phases(fleet["statuses"]) == ["received", "verified", "pulling", "starting", "healthy", "committed"]
    current = the_one_container(engine, name)
    assert current.image.labels["org.opencontainers.image.version"] == "2.0.0"
    assert "LINE=press-7" in current.attrs["Config"]["Env"]
    assert any(m["Destination"] == "/data" and m["Source"] == str(fleet["data"]) for m in current.attrs["Mounts"])
    previous = engine.containers.get(f"{name}-previous")
    assert previous.status == "exited" and previous.image.labels["org.opencontainers.image.version"] == "1.0.0"


def test_unhealthy_candidate_is_rolled_back(fleet: dict[str, Any], keys: tuple[str, str]) -> None:
    agent, engine, name = fleet["agent"], fleet["engine"], fleet["name"]
    assert agent.handle(signed(fleet["v3"], "3.0.0", keys[0])) == "rolled_back"
    assert phases(fleet["statuses"])[-3:] == ["pulling", "starting", "rolled_back"]
    assert "unhealthy" in fleet["statuses"][-1]["reason"]
    current = the_one_container(engine, name)
    assert current.image.labels["org.opencontainers.image.version"] == "1.0.0"


@pytest.mark.parametrize("case", ["tampered", "wrong_key", "unsigned", "downgrade", "not_pinned"])
def test_bad_manifests_are_refused_and_nothing_is_pulled(fleet: dict[str, Any], keys: tuple[str, str],
                                                         case: str) -> None:
    agent, engine = fleet["agent"], fleet["engine"]
    other_private, _ = generate_keypair()
    payload = {
        "tampered": json.dumps({**json.loads(signed(fleet["v2"], "2.0.0", keys[0])), "image": fleet["v3"]}),
        "wrong_key": signed(fleet["v2"], "2.0.0", other_private),
        "unsigned": Manifest(image=fleet["v2"], version="2.0.0").model_dump_json(exclude_none=True),
        "downgrade": signed(fleet["v2"], "0.9.0", keys[0]),
        "not_pinned": signed(fleet["v2"].split("@")[0] + ":latest", "2.0.0", keys[0]),
    }[case]
    assert agent.handle(payload) == "refused"
    assert phases(fleet["statuses"]) == ["received", "refused"]
    reason = fleet["statuses"][-1]["reason"]
    assert {"tampered": "tampered", "wrong_key": "trusted fleet key", "unsigned": "not signed",
            "downgrade": "not newer", "not_pinned": "not pinned by digest"}[case] in reason
    local = [d for img in engine.images.list() for d in img.attrs.get("RepoDigests", [])]
    assert fleet["v2"] not in local and fleet["v3"] not in local  # refused before any pull


AGENT = """
import json, sys, docker
from pathlib import Path
from edge_runtime.ota.agent import OtaAgent
log = open(sys.argv[3], "a")
agent = OtaAgent(docker.from_env(), sys.argv[1], Path(sys.argv[2]), [sys.argv[4]],
                 lambda s: (log.write(json.dumps(s) + "\\n"), log.flush()), health_timeout_s=20)
print(agent.recover() if sys.argv[5] == "recover" else agent.handle(sys.stdin.read()))
"""


@pytest.mark.parametrize("crash_after", ["verified", "pulling", "starting", "waiting_health", "committing"])
def test_agent_killed_at_each_step_converges_on_restart(fleet: dict[str, Any], keys: tuple[str, str],
                                                        crash_after: str, tmp_path: Path) -> None:
    engine, name = fleet["engine"], fleet["name"]
    log = tmp_path / "status.jsonl"
    args = [sys.executable, "-c", AGENT, name, str(fleet["state"]), str(log), keys[1]]
    crashed = subprocess.run([*args, "handle"], input=signed(fleet["v2"], "2.0.0", keys[0]), text=True,
                             capture_output=True, env={**os.environ, "EDGE_OTA_CRASH_AFTER": crash_after}, timeout=120)
    assert crashed.returncode == 137, crashed.stderr  # died right after recording the step
    recovered = subprocess.run([*args, "recover"], text=True, capture_output=True, timeout=120)
    assert recovered.returncode == 0, recovered.stderr
    current = the_one_container(engine, name)
    version = current.image.labels["org.opencontainers.image.version"]
    # Until the candidate was started the old version stays; once the candidate runs, it wins if healthy.
    assert version == ("2.0.0" if crash_after in ("waiting_health", "committing") else "1.0.0")
    assert json.loads(fleet["state"].read_text())["phase"] == "idle"


def test_statuses_arrive_on_mqtt_in_order(fleet: dict[str, Any], keys: tuple[str, str], tmp_path: Path,
                                         ota_broker: int) -> None:
    from edge_runtime.config import Config

    config = Config.model_validate({
        "device_id": "ota-dev", "data_dir": str(tmp_path), "mqtt": {"host": "127.0.0.1", "port": ota_broker},
        "ota": {"container": fleet["name"], "public_keys": [keys[1]], "state_dir": str(tmp_path / "ota"),
                "health_timeout_s": 20}})
    sub, seen = watch_status(ota_broker, "ota-dev")
    agent, stop = start_agent(config)
    try:
        time.sleep(1.0)
        manifest = tmp_path / "m.json"
        manifest.write_text(signed(fleet["v2"], "2.0.0", keys[0]))
        proc = subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "publish", str(manifest), "--device",
                               "ota-dev", "--host", "127.0.0.1", "--port", str(ota_broker)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + 60
        while not any(m["phase"] == "committed" for m in seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [m["phase"] for m in seen] == ["received", "verified", "pulling", "starting", "healthy", "committed"]
    finally:
        stop.set()
        agent.join(10)
        sub.loop_stop()


def test_a_manifest_for_a_newer_agent_is_refused(fleet: dict[str, Any], keys: tuple[str, str]) -> None:
    payload = signed(fleet["v2"], "2.0.0", keys[0], min_agent_version="99.0.0")
    assert fleet["agent"].handle(payload) == "refused"
    assert "needs agent 99.0.0 or newer" in fleet["statuses"][-1]["reason"]


def test_group_topic_and_polled_manifest_url_both_deliver(fleet: dict[str, Any], keys: tuple[str, str],
                                                          tmp_path: Path, ota_broker: int) -> None:
    """A group publish reaches the device; a manifest served over HTTP is picked up by polling."""
    import http.server

    from edge_runtime.config import Config

    port = ota_broker
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text(signed(fleet["v2"], "2.0.0", keys[0]))
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    config = Config.model_validate({
        "device_id": "ota-poll", "data_dir": str(tmp_path), "mqtt": {"host": "127.0.0.1", "port": port},
        "ota": {"container": fleet["name"], "public_keys": [keys[1]], "state_dir": str(tmp_path / "ota"),
                "health_timeout_s": 20, "groups": ["line-1"], "poll_interval_s": 10,
                "manifest_url": f"http://127.0.0.1:{web.server_address[1]}/manifest.json"}})
    sub, seen = watch_status(port, "ota-poll")
    agent, stop = start_agent(config)
    try:
        deadline = time.monotonic() + 60
        while not any(s["phase"] == "committed" for s in seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [s["phase"] for s in seen][-1] == "committed"  # the polled manifest was applied
        # The same release again, now to the group topic: the running one (its digest is the container's
        # image's), so it is reported as the current state, not refused as not newer; proving it arrived.
        manifest = tmp_path / "again.json"
        manifest.write_text(signed(fleet["v2"], "2.0.0", keys[0]))
        proc = subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "publish", str(manifest), "--group",
                               "line-1", "--host", "127.0.0.1", "--port", str(port)], capture_output=True, text=True)
        assert proc.returncode == 0 and "edge/group/line-1/cmd/ota" in proc.stdout
        deadline = time.monotonic() + 20
        while seen[-1]["phase"] != "current" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [s["phase"] for s in seen][-2:] == ["received", "current"] and seen[-1]["version"] == "2.0.0"
    finally:
        stop.set()
        agent.join(10)
        sub.loop_stop()
        web.shutdown()
        web.server_close()

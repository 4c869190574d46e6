"""A reload to an emptied file, or to one that lost a protection or every camera, is refused like a
deleted file: one ERROR line, the running config kept, the reload command answers why. Saying it in
the file (`token: null`, `cameras: []`) is how an operator means it. At start an empty file is exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from edge_runtime.config import parse_config
from edge_runtime.config.reload_guard import refusal
from edge_runtime.core.samples import write_sample_video
from tests.app.test_lifecycle import start, wait_until
from tests.support.broker import Broker
from tests.support.mjpeg import free_port
from tests.support.receiver import Subscriber
from tests.support.waiting import wait_for

TOKEN = "s3cret-token-for-the-line"
CONFIG = """\
device_id: guard-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
mqtt: {{host: 127.0.0.1, port: {broker}}}
api:
  host: 127.0.0.1
  port: {api}
  token: ${{EDGE_API_TOKEN}}
  auth: all
cameras:
  - name: cam
    source: {video}
    trigger: {{mode: interval, interval_s: 0.5}}
"""


def get(port: int, path: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return 0, None


def test_sighup_with_an_emptied_file_keeps_the_token_the_auth_and_the_camera(tmp_path: Path,
                                                                            demo_dir: Path) -> None:
    broker = Broker(tmp_path / "broker").start()
    replies = Subscriber(broker.port, "edge/guard-1/cmd/reload/reply")
    api = free_port()
    cfg = tmp_path / "edge.yaml"
    text = CONFIG.format(data=tmp_path / "data", bundle=demo_dir, broker=broker.port, api=api,
                         video=write_sample_video(tmp_path / "v.avi", frames=20))
    cfg.write_text(text)
    log = tmp_path / "log"
    proc = start(cfg, log, env={"EDGE_API_TOKEN": TOKEN})

    def inspected() -> int:
        code, status = get(api, "/api/v1/status", TOKEN)
        return int(status["cameras"][0]["frames"]["inspected"]) if code == 200 else -1

    try:
        wait_until(lambda: inspected() >= 1, timeout=90)
        wait_until(lambda: replies.subscribed.is_set(), timeout=10)
        emptied = {"0 bytes": "", "comment only": "# edge-runtime config, rewritten by the fleet tool\n\n",
                   "token line gone": text.replace("  token: ${EDGE_API_TOKEN}\n", ""),
                   "api section gone": text[:text.index("api:")] + text[text.index("cameras:"):],
                   "cameras gone": text[:text.index("cameras:")]}
        for n, (name, content) in enumerate(emptied.items(), 1):
            cfg.write_text(content)
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda n=n: log.read_text().count("reload refused") == n, timeout=30)
            assert get(api, "/api/v1/status")[0] == 401, name  # before: 200 without a token
            before = inspected()
            wait_until(lambda before=before: inspected() > before, timeout=30)  # the camera still runs
            status = get(api, "/api/v1/status", TOKEN)[1]
            assert status["device"] == "guard-1" and [c["name"] for c in status["cameras"]] == ["cam"], name
        refused = [line for line in log.read_text().splitlines() if "reload refused" in line]
        assert len(refused) == len(emptied) and all(" ERROR " in line for line in refused)
        assert "the config file is empty" in refused[0] and "the config file is empty" in refused[1]
        assert "drops api.token (missing from the file" in refused[2] and "api.token: null" in refused[2]
        assert "api.token, api.auth, api.host" in refused[3] and "every camera (cam)" in refused[4]
        assert TOKEN not in log.read_text()

        # The reload command answers with the reason (and the daemon keeps its config).
        replies.client.publish("edge/guard-1/cmd/reload", b'{"id": "r-1"}', qos=1)
        reply = wait_for(lambda: replies.on("/reply"), 30, "the reload reply")[-1]
        assert reply["ok"] is False and "every camera (cam)" in reply["error"] and "cameras: []" in reply["error"]

        # Meant: the key written with its new value is applied.
        cfg.write_text(text.replace("  token: ${EDGE_API_TOKEN}\n  auth: all\n", "  token: null\n  auth: writes\n"))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "config reloaded" in log.read_text(), timeout=60)
        assert get(api, "/api/v1/status")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        replies.client.loop_stop()
        broker.stop()
    assert rc == 0 and "Traceback" not in log.read_text()


@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n", "---\n", "~\n"])
def test_an_empty_config_file_given_at_start_is_one_line_and_exit_2(content: str, tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "--config", str(path), "run"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"edge-runtime: error: {path}: the config file is empty (no settings); "
                                                "leave out --config to run on the defaults, or write {} to mean them"]


BASE = """\
device_id: press-7
api: {token: old-token, auth: all, host: 127.0.0.1}
mqtt: {username: cam7, password: pw-secret-7, tls: {enabled: true, cert_file: /c.pem, key_file: /k.pem}}
cameras:
  - {name: a, source: /dev/video0}
  - {name: b, source: /dev/video1}
"""


@pytest.mark.parametrize(("new", "accepted"), [
    (BASE.replace("old-token", "new-token"), True),  # rotating the token
    (BASE.replace("  - {name: b, source: /dev/video1}\n", ""), True),  # removing one camera of two
    (BASE.replace("token: old-token, ", "token: null, "), True),  # removing the token, said so
    (BASE.replace("auth: all", "auth: writes"), True),
    (BASE.replace("tls: {enabled: true, cert_file: /c.pem, key_file: /k.pem}",
                  "tls: {enabled: false, cert_file: null, key_file: null}"), True),
    (BASE[:BASE.index("cameras:")] + "cameras: []\n", True),
    (BASE.replace("press-7", "press-8"), True),  # renamed on purpose
    (BASE.replace("device_id: press-7\n", ""), False),  # would become the host name
    ("{}", False),
    (BASE.replace("token: old-token, ", ""), False),
    (BASE.replace("token: old-token, ", "token: '', "), False),  # what an unset ${VAR:-} gives
    (BASE.replace("auth: all, ", ""), False),
    (BASE.replace("host: 127.0.0.1", "port: 8080"), False),  # listening on every interface, unsaid
    (BASE.replace("username: cam7, password: pw-secret-7, ", ""), False),
    (BASE.replace("enabled: true, ", ""), False),
    (BASE.replace(", cert_file: /c.pem, key_file: /k.pem", ""), False),
    (BASE[:BASE.index("cameras:")], False),
])
def test_a_reload_may_lose_a_protection_only_when_the_file_says_so(new: str, accepted: bool) -> None:
    old = parse_config(BASE)
    why = refusal(old, parse_config(new), [c.name for c in old.cameras])
    assert (why is None) is accepted, why
    assert why is None or ("write it explicitly" in why and "old-token" not in why and "pw-secret-7" not in why)


def test_cameras_added_on_the_command_line_are_not_the_files_to_lose() -> None:
    old = parse_config(BASE[:BASE.index("cameras:")])
    assert refusal(old, parse_config(BASE[:BASE.index("cameras:")]), []) is None  # `run --demo`: file has none

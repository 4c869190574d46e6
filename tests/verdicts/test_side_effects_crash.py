"""A rule's side effects cannot be lost: a real daemon killed right after the journal commit of a result
whose rule fired still sends that result's alert and webhook after the restart (real Mosquitto, a real
HTTP receiver, llama.cpp + ONNX Runtime on the demo bundle)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from edge_runtime.core.samples import write_sample_video
from tests.support.broker import Broker
from tests.support.daemon_http import trigger
from tests.support.mjpeg import free_port
from tests.support.receiver import Receiver, Subscriber
from tests.support.waiting import wait_for

CONFIG = """\
device_id: crash-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
mqtt: {{host: 127.0.0.1, port: {mqtt}}}
api: {{host: 127.0.0.1, port: {api}}}
cameras:
  - name: cam
    source: {video}
    trigger: {{mode: on_demand}}
rules:
  - name: every          # no conditions: fires on every verdict
    actions:
      - type: alert
      - type: webhook
        url: {hook}
      - type: review
"""


# The real daemon, with the journal's commit wrapped: the process ends like a power cut right after the
# commit of the first journaled result (a real commit, on the real path), before anything after it runs.
CRASH_AFTER_FIRST_COMMIT = """
import os, sys
from edge_runtime.verdicts.journal import Journal
real_add = Journal.add
def add_then_die(self, *args, **kwargs):
    real_add(self, *args, **kwargs)
    os._exit(137)
Journal.add = add_then_die
sys.argv[0] = "edge-runtime"
from edge_runtime.cli.main import main
sys.exit(main())
"""


def fired_results(db_path: Path) -> list[str]:
    """Ids of the journaled results on which a rule fired, read from the file the daemon left."""
    db = sqlite3.connect(str(db_path))
    try:
        rows = db.execute("SELECT id, body FROM results ORDER BY seq").fetchall()
    finally:
        db.close()
    return [rid for rid, body in rows if json.loads(body).get("rules")]


def pending_reviews(db_path: Path) -> set[str]:
    db = sqlite3.connect(str(db_path))
    try:
        return {r[0] for r in db.execute("SELECT result_id FROM reviews WHERE state = 'pending'")}
    finally:
        db.close()


def test_a_kill_right_after_the_journal_commit_loses_no_alert_webhook_or_review_mark(
        tmp_path: Path, demo_dir: Path) -> None:
    broker = Broker(tmp_path / "broker").start()
    receiver = Receiver().start()
    alerts = Subscriber(broker.port, "edge/crash-1/+/alert")
    api = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "data", bundle=demo_dir, mqtt=broker.port, api=api,
                                    video=write_sample_video(tmp_path / "v.avi", frames=30), hook=receiver.url))
    journal = tmp_path / "data" / "journal.sqlite3"

    def start(crash: bool) -> subprocess.Popen[bytes]:
        plain = "import sys; from edge_runtime.cli.main import main; sys.exit(main())"
        code = CRASH_AFTER_FIRST_COMMIT if crash else plain
        return subprocess.Popen([sys.executable, "-c", code, "--config", str(config), "run"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def alerts_of(rid: str) -> list[dict[str, Any]]:
        return [a for a in alerts.on("/cam/alert") if a["result_id"] == rid]

    def webhook_of(rid: str) -> bool:
        return f"{rid}:every:1" in receiver.keys()

    proc = start(crash=True)
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            if trigger(api) is not None:
                raise AssertionError("the daemon answered a trigger: the crash point did not fire")
            time.sleep(0.2)
        assert proc.wait(timeout=10) == 137, "the daemon did not end at the crash point"
        fired = fired_results(journal)
        assert fired, "no journaled result with a fired rule before the crash"

        proc = start(crash=False)
        for rid in fired:
            wait_for(partial(alerts_of, rid), 60, f"the alert of {rid} after the restart")
            wait_for(partial(webhook_of, rid), 30, f"the webhook of {rid}")
        assert set(fired) <= pending_reviews(journal)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        alerts.close()
        receiver.stop()
        broker.stop()

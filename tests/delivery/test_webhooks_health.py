"""A webhook receiver that stops taking deliveries shows in the daemon's health as degraded, naming the
destination, while the device stays ready (inspection goes on); it heals by itself when the receiver
answers again. Real daemon (demo bundle), real HTTP receiver on loopback."""

from __future__ import annotations

from pathlib import Path

from edge_runtime.core.samples import write_sample_video
from tests.support.file_daemon import daemon_from_file
from tests.support.receiver import Receiver
from tests.support.waiting import wait_for

CONFIG = """\
device_id: hooks-1
data_dir: {data}
model: {{path: {bundle}, threads: 2}}
mqtt: {{enabled: false}}
api: {{enabled: false}}
cameras:
  - name: cam
    source: {video}
    trigger: {{mode: on_demand}}
rules:
  - name: every
    actions:
      - type: webhook
        url: http://127.0.0.1:{port}/hook
        timeout_s: 1
"""


def test_a_receiver_that_is_down_degrades_health_without_unreadying_and_heals(tmp_path: Path,
                                                                              demo_dir: Path) -> None:
    receiver = Receiver()  # not started yet: every POST to its port is refused
    port = receiver.port
    text = CONFIG.format(data=tmp_path / "data", bundle=demo_dir, port=port,
                         video=write_sample_video(tmp_path / "v.avi", frames=20))
    try:
        with daemon_from_file(tmp_path / "edge.yaml", text) as started:
            daemon = started.daemon
            wait_for(lambda: daemon.rigs["cam"].camera.slot.peek() is not None, 30, "the camera's first frame")
            daemon.entry.trigger("cam").result(timeout=60)
            health = wait_for(lambda: (h := daemon.health())["state"] == "degraded" and h, 30, "degraded health")
            assert health["ready"] is True, health  # inspection goes on: no rollout undoes an update for this
            assert health["reasons"] == [f"webhooks: blocked: http://127.0.0.1:{port}"], health

            receiver.start()  # the receiver comes up where the rule points
            wait_for(lambda: receiver.keys(), 60, "the held delivery after the receiver came up")
            wait_for(lambda: daemon.health()["state"] == "ok", 30, "health to heal by itself")
    finally:
        receiver.stop()


def test_a_refused_delivery_of_a_rule_removed_by_a_reload_is_set_aside_and_health_heals(tmp_path: Path,
                                                                                     demo_dir: Path) -> None:
    """A 401 waits for a fix while the rule is in the running config; once a reload removes the rule, nothing
    can fix that row (it would go without the rule's headers), so it is set aside instead of blocking its
    destination for ever."""
    receiver = Receiver(status=401).start()
    text = CONFIG.format(data=tmp_path / "data", bundle=demo_dir, port=receiver.port,
                         video=write_sample_video(tmp_path / "v.avi", frames=20))
    path = tmp_path / "edge.yaml"
    try:
        with daemon_from_file(path, text) as started:
            daemon = started.daemon
            wait_for(lambda: daemon.rigs["cam"].camera.slot.peek() is not None, 30, "the camera's first frame")
            daemon.entry.trigger("cam").result(timeout=60)
            wait_for(lambda: daemon.webhooks.attempts_failed >= 2, 30, "the refused delivery tried again")
            assert daemon.webhooks.status()["failed"] == 0  # the rule is still there: it waits for a fix
            assert daemon.health()["state"] == "degraded"

            path.write_text(text[:text.index("rules:")])  # the rule is removed
            daemon.reload()
            wait_for(lambda: daemon.webhooks.status()["failed"] == 1, 30, "the orphaned row set aside")
            assert daemon.webhooks.status()["pending"] == 0
            wait_for(lambda: daemon.health()["state"] == "ok", 30, "health to heal")
    finally:
        receiver.stop()

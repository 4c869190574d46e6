"""The shipped fleet bridge (l4t_docker/central/mosquitto-bridge.conf) between two real Mosquitto
brokers: the daemon publishes to the device broker, the central broker goes away and comes back,
and every result in the device's journal arrives centrally."""

from __future__ import annotations

import json
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import write_sample_video
from tests.support.broker import Broker
from tests.support.waiting import wait_for

BRIDGE = Path(__file__).resolve().parents[2] / "l4t_docker" / "central" / "mosquitto-bridge.conf"


def render_bridge(device_id: str, central_port: int) -> str:
    """What `envsubst` does to the shipped file (docs/scale-out.md), with a check that nothing is left."""
    text = string.Template(BRIDGE.read_text()).substitute(
        DEVICE_ID=device_id, CENTRAL_HOST="127.0.0.1", CENTRAL_PORT=str(central_port))
    assert "${" not in text
    return text


class CentralSubscriber:
    """A fleet consumer on the central broker: persistent session, QoS 1, counts unique result ids."""

    def __init__(self, port: int) -> None:
        self.ids: set[str] = set()
        self.messages = 0
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fleet-consumer", clean_session=False)
        self.client.on_connect = lambda c, *_: c.subscribe("edge/+/+/result", qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.2, 1)  # type: ignore[arg-type]  # paho annotates int; it takes a float
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages += 1
            self.ids.add(json.loads(msg.payload)["id"])

    def seen(self) -> set[str]:
        with self._lock:
            return set(self.ids)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[Broker, Broker]]:
    central = Broker(tmp_path / "central")
    device = Broker(tmp_path / "device")
    with device.conf.open("a") as conf:  # the shipped drop-in, as conf.d would add it
        conf.write(render_bridge("line-1", central.port))
    central.start()
    device.start()
    yield device, central
    device.stop()
    central.stop()


LONG = [pytest.mark.robustness]  # in `make test-robustness`


@pytest.mark.parametrize("made_during_outage", [8, pytest.param(120, marks=LONG, id="long-outage")])
def test_every_result_reaches_the_central_broker_after_it_was_down(
        brokers: tuple[Broker, Broker], tmp_path: Path, demo_dir: Path, made_during_outage: int) -> None:
    device, central = brokers
    consumer = CentralSubscriber(central.port)
    video = write_sample_video(tmp_path / "v.avi", frames=40)
    cfg = Config(device_id="line-1", data_dir=tmp_path / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.api.enabled = False
    cfg.governor.enabled = False
    cfg.mqtt.port = device.port
    cfg.cameras = [CameraConfig(name="belt", source=str(video), fps=30,
                                trigger=TriggerConfig(mode="interval", interval_s=0.25))]
    daemon = Daemon(cfg)
    daemon.start()
    try:
        wait_for(lambda: len(consumer.seen()) >= 3, 30, "results at the central broker")
        central.stop()
        t_down = time.monotonic()
        before = daemon.journal.counts()["total"]
        # Results made during the outage are acknowledged by the DEVICE broker (outbox empty) ...
        wait_for(lambda: daemon.journal.counts()["total"] >= before + made_during_outage, 30 + made_during_outage,
                 "results during the outage")
        outage_ids = {r["id"] for r in daemon.journal.query(limit=1000)} - consumer.seen()
        wait_for(lambda: daemon.journal.counts()["unsent"] == 0, 30, "the device broker to take them")
        central.start()
        t_up = time.monotonic()
        for rig in daemon.rigs.values():
            rig.stop()
        wait_for(lambda: daemon.journal.counts()["unsent"] == 0, 30, "the outbox to drain")
        journal_ids = {r["id"] for r in daemon.journal.query(limit=100_000)}
        # ... and every one of them arrives centrally once the bridge is back.
        wait_for(lambda: journal_ids <= consumer.seen(), 60, "every result at the central broker")
        caught_up = time.monotonic() - t_up
    finally:
        daemon.stop()
        consumer.close()
    print(f"bridge: outage {t_up - t_down:.1f} s, {len(outage_ids)} results made during it, "
          f"{len(journal_ids)} in the journal, all {len(consumer.seen())} unique ids central "
          f"{caught_up:.1f} s after the central broker restarted ({consumer.messages} messages)")
    assert len(outage_ids) >= made_during_outage
    assert consumer.seen() == journal_ids

"""A GGUF + mmproj bundle through the whole daemon, not only the inspector: a camera's verdicts are
journaled and schema-valid, rules and evidence run on them, and the OpenAI endpoint answers a chat with
an image under a JSON schema, on the tiny Qwen2.5-VL, Qwen3-VL, LFM2-VL, InternVL, Kimi-VL and MiniCPM-V 4.6
pairs (libmtmd encodes, our batches decode)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from jsonschema import Draft202012Validator

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.config.rules import Rule
from edge_runtime.core.samples import write_sample_video
from tests.support.tiny_pairs import TINY_SCHEMA, TinyPair, write_pair_bundle
from tests.support.waiting import wait_for


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl", "lfm2-vl", "internvl", "kimi-vl", "minicpm-v"])
def test_a_pair_bundle_serves_cameras_rules_evidence_and_the_openai_endpoint(
        family: str, tmp_path: Path, tiny_pairs: Callable[[str], TinyPair]) -> None:
    bundle = write_pair_bundle(tiny_pairs(family), tmp_path / "bundle")
    cfg = Config(device_id="pair-test", data_dir=tmp_path / "data")
    cfg.model.path = bundle
    cfg.model.threads = 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.evidence.keep_passes = 1.0
    cfg.rules = [Rule.model_validate({"name": "every-verdict", "actions": [{"type": "review"}]})]
    cfg.cameras = [CameraConfig(name="belt", source=str(write_sample_video(tmp_path / "v.avi", frames=20)),
                                fps=20, trigger=TriggerConfig(mode="interval", interval_s=0.2))]
    daemon = Daemon(cfg)
    daemon.start()
    try:
        assert daemon.api is not None
        client = daemon.api.app.test_client()
        wait_for(lambda: daemon.journal.counts()["total"] >= 3, timeout=60, what="three camera verdicts")
        validator = Draft202012Validator(TINY_SCHEMA)
        rows = daemon.journal.query(camera="belt", limit=3)
        for row in rows:
            assert list(validator.iter_errors(row["verdict"])) == []
            assert row["rules"][0]["name"] == "every-verdict" and row["review"]["state"] == "pending"
            assert row["evidence"] is not None
        with client.get(f"/api/v1/results/{rows[0]['id']}/image.jpg") as image:  # the file is served, then closed
            assert image.status_code == 200 and image.data[:2] == b"\xff\xd8"
        ok, jpeg = cv2.imencode(".jpg", np.full((96, 128, 3), 90, np.uint8))
        assert ok
        url = "data:image/jpeg;base64," + base64.b64encode(jpeg.tobytes()).decode()
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        info = daemon.model_info()
        assert info is not None
        t0 = time.monotonic()
        reply = client.post("/v1/chat/completions", json={
            "model": info.name, "max_tokens": 24,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "Is it fine?"}]}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}}})
        assert reply.status_code == 200, reply.get_data(as_text=True)
        body = reply.get_json()
        assert isinstance(json.loads(body["choices"][0]["message"]["content"])["ok"], bool)
        assert time.monotonic() - t0 < 30
        assert daemon.health()["state"] == "ok"
    finally:
        daemon.stop()

"""Hostile manifests on the agent's MQTT topic (anyone who may publish there): each is refused with a
bounded reason on the status topic, and what waits for the agent is bounded. No Docker engine needed:
every refusal here happens before the agent touches a container."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker.errors

from edge_runtime.ota.agent import OtaAgent
from edge_runtime.ota.manifest import MAX_MANIFEST_BYTES, Manifest, generate_keypair, sign
from edge_runtime.ota.service import MAX_WAITING_MANIFESTS, ManifestInbox

IMAGE = "registry.local/edge@sha256:" + "0" * 64


class _NoContainers:
    """The engine's answer for a device whose container is not there yet (the refusals come first)."""

    def get(self, name: str) -> Any:
        raise docker.errors.NotFound(name)


class _Engine:
    containers = _NoContainers()


def _agent(tmp_path: Path, public: str = "") -> tuple[OtaAgent, list[dict[str, Any]]]:
    statuses: list[dict[str, Any]] = []
    keys = [public] if public else [generate_keypair()[1]]
    return OtaAgent(_Engine(), "edge", tmp_path / "state.json", keys, statuses.append), statuses


def test_a_deeply_nested_manifest_is_refused_with_a_status(tmp_path: Path) -> None:
    # json.loads raised RecursionError out of handle(): the retained status stayed "received" for good.
    agent, statuses = _agent(tmp_path)
    assert agent.handle(b"[" * 20_000 + b"]" * 20_000) == "refused"
    assert [s["phase"] for s in statuses] == ["received", "refused"]
    assert "not valid JSON" in statuses[-1]["reason"]


def test_an_oversized_manifest_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    agent, statuses = _agent(tmp_path)
    payload = json.dumps({"image": IMAGE, "version": "2.0.0", "notes": "", "signature": "x",
                          "evaluation": {"pad": ["x"] * 200_000}}).encode()
    assert agent.handle(payload) == "refused"
    assert statuses[-1]["reason"] == f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB"


def test_a_refusal_never_echoes_a_huge_field(tmp_path: Path) -> None:
    # An unsigned 10 MB image reference was echoed whole into the retained status and the log line.
    agent, statuses = _agent(tmp_path)
    for field in ("image", "signature", "min_agent_version", "version"):
        statuses.clear()
        body = {"image": IMAGE, "version": "2.0.0", "signature": "x", field: "a" * 50_000}
        assert agent.handle(json.dumps(body)[:MAX_MANIFEST_BYTES]) == "refused"
        assert field in statuses[-1]["reason"] and len(json.dumps(statuses[-1])) < 1000, field


def test_a_signed_manifest_with_a_bad_min_agent_version_is_refused(tmp_path: Path) -> None:
    # A fleet key signed it (a careless release): verify() then raised ValueError from int("latest").
    private, public = generate_keypair()
    agent, statuses = _agent(tmp_path, public)
    manifest = sign(Manifest.model_construct(image=IMAGE, version="2.0.0", min_agent_version="latest", notes="",
                                             evaluation=None, signature=None), private)
    assert agent.handle(manifest.model_dump_json(exclude_none=True)) == "refused"
    assert "min_agent_version" in statuses[-1]["reason"]


def test_the_inbox_keeps_a_bounded_number_of_bounded_manifests() -> None:
    # The queue of manifests from MQTT had no bound while an update waited (for the line, up to hours).
    inbox = ManifestInbox()
    for _ in range(MAX_WAITING_MANIFESTS + 50):
        inbox.offer(b"x" * (4 * MAX_MANIFEST_BYTES))
    assert inbox.queue.qsize() == MAX_WAITING_MANIFESTS and inbox.dropped == 50
    kept = inbox.queue.get_nowait()
    assert len(kept) == MAX_MANIFEST_BYTES + 1  # enough for the agent to refuse it with its reason


def test_an_oversized_payload_that_starts_blank_is_refused_not_taken_for_a_cleared_manifest(tmp_path: Path) -> None:
    # The inbox looked only at the bytes it keeps (64 KiB + 1): a payload past the bound whose first 64 KiB
    # were blank was logged as "an empty message (a cleared retained manifest)" and dropped, so the operator
    # saw no refusal for a manifest too large to take.
    inbox = ManifestInbox()
    inbox.offer(b" " * (MAX_MANIFEST_BYTES + 10) + json.dumps({"image": IMAGE, "version": "2.0.0"}).encode())
    inbox.offer(b" \r\n\t" * 1000)  # blank within the bound: no manifest
    assert inbox.queue.qsize() == 1
    agent, statuses = _agent(tmp_path)
    assert agent.handle(inbox.queue.get_nowait()) == "refused"
    assert statuses[-1]["reason"] == f"the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB"


def test_ota_publish_refuses_a_target_that_is_not_one_topic_level(tmp_path: Path) -> None:
    # `--group +` went to paho, which raises ValueError for a wildcard in a publish topic: an internal
    # error instead of one line naming the option (and `--device a/b` reached another device's topic).
    import os
    import subprocess
    import sys

    manifest = tmp_path / "m.json"
    manifest.write_text("{}")
    for option, value in (("--group", "+"), ("--group", "line/1"), ("--device", "#"), ("--device", "a/b")):
        proc = subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "publish", str(manifest), option, value,
                               "--host", "127.0.0.1", "--port", "1"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "EDGE_RUNTIME_DATA": str(tmp_path)})
        assert proc.returncode == 2, proc.stderr
        assert f"{option}: use 1-64 letters" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr

"""The image route answered 410 "deleted by retention" whenever the result still had a `uri`: for
evidence turned off after a restart, for a thumbnail that could not be made again on a full disk, for
an image it may not read. 410 is for a result whose image was removed (`evidence.removed`); the rest
is a 404 saying why, or a 503 naming the storage (against the fake device of test_api_device)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from edge_runtime.api import create_app
from edge_runtime.core.device import EvidenceFile
from edge_runtime.delivery.events import EventHub
from tests.api.test_api_device import MODEL, FakeDevice, _as_device

EVIDENCE: dict[str, Any] = {"uri": "/api/v1/results/r9/image.jpg", "sha256": "ab" * 32, "bytes": 10,
                            "width": 8, "height": 8}


class Device(FakeDevice):
    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, MODEL)
        self.result: dict[str, Any] = {"id": "r9", "ts": "2026-12-05T12:00:00Z", "camera": "belt",
                                       "verdict": {"defect": False}, "evidence": dict(EVIDENCE)}
        self.file_error: OSError | None = None
        self.file: Path | None = None
        self.journal_error: Exception | None = None

    def get_result(self, result_id: str) -> dict[str, Any] | None:
        if self.journal_error is not None:
            raise self.journal_error
        return self.result if result_id == "r9" else None

    def evidence_file(self, result_id: str, thumbnail: bool = False) -> EvidenceFile | None:
        if self.file_error is not None:
            raise self.file_error
        return EvidenceFile(self.file, "x") if self.file is not None else None


@pytest.fixture
def device(tmp_path: Path) -> Device:
    return Device(tmp_path)


@pytest.fixture
def app(device: Device) -> Flask:
    return create_app(_as_device(device), device.config.api, events=EventHub())


def _error(app: Flask, path: str) -> tuple[int, dict[str, Any]]:
    resp = app.test_client().get(path)
    return resp.status_code, (resp.json or {}).get("error", {})


def test_evidence_turned_off_is_a_404_saying_so_not_deleted_by_retention(app: Flask, device: Device) -> None:
    device.config.evidence.enabled = False  # after a restart: the journal still has the link
    status, error = _error(app, "/api/v1/results/r9/image.jpg")
    assert status == 404 and "evidence is off" in error["message"], (status, error)


def test_a_thumbnail_that_cannot_be_made_on_a_full_disk_is_a_503_naming_storage(app: Flask, device: Device) -> None:
    device.file_error = OSError(errno.ENOSPC, "No space left on device")
    status, error = _error(app, "/api/v1/results/r9/thumbnail.jpg")
    assert status == 503 and error["type"] == "storage_error", (status, error)
    assert "No space left on device" in error["message"] and "storage" in error["message"]


def test_an_image_it_may_not_read_is_a_503_not_a_410(app: Flask, device: Device, tmp_path: Path) -> None:
    device.file = tmp_path / "locked.jpg"
    device.file.write_bytes(b"\xff\xd8x\xff\xd9")
    device.file_error = PermissionError(errno.EACCES, "Permission denied")
    status, error = _error(app, "/api/v1/results/r9/image.jpg")
    assert status == 503 and error["type"] == "storage_error", (status, error)


def test_a_link_not_marked_removed_is_no_410(app: Flask, device: Device) -> None:
    status, error = _error(app, "/api/v1/results/r9/image.jpg")  # evidence on; the store has no file for it
    assert status == 404 and error["type"] == "not_found", (status, error)
    device.result["evidence"] = {**EVIDENCE, "uri": None, "removed": {"at": "2026-12-05T12:01:00Z",
                                                                      "why": "retention"}}
    status, error = _error(app, "/api/v1/results/r9/image.jpg")
    assert status == 410 and "deleted by retention" in error["message"], (status, error)

"""`edge-runtime ota hawkbit-upload` against a recorded hawkBit Management API (answers shaped like its
documented examples): a software module with the manifest as artifact, then a distribution set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_runtime.ota.manifest import Manifest, generate_keypair, sign
from tests.ota.ddi_server import Recorded, ddi_server

IMAGE = "registry.plant.local/edge-runtime@sha256:" + "ab" * 32


@pytest.fixture
def served() -> Iterator[tuple[Recorded, str]]:
    recorded = Recorded()
    with ddi_server(recorded) as url:
        yield recorded, url


def upload(url: str, manifest: Path, *extra: str, password: str | None = "admin") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HAWKBIT_PASSWORD"}
    if password is not None:
        env["HAWKBIT_PASSWORD"] = password
    return subprocess.run([sys.executable, "-m", "edge_runtime", "ota", "hawkbit-upload", str(manifest), "--url", url,
                           "--module", "edge-runtime-press", *extra], capture_output=True, text=True, env=env,
                          timeout=60)


def test_a_release_becomes_a_software_module_and_a_distribution_set(served: tuple[Recorded, str],
                                                                    tmp_path: Path) -> None:
    recorded, url = served
    recorded.json("/rest/v1/softwaremodules", [{"name": "edge-runtime-press", "version": "2.0.0", "type": "application",
                                                "id": 23}], status=201)
    recorded.json("/rest/v1/softwaremodules/23/artifacts", {"id": 7, "size": 300, "providedFilename":
                                                            "manifest.signed.json"}, status=201)
    recorded.json("/rest/v1/distributionsets", [{"name": "edge-runtime-press", "version": "2.0.0", "id": 6}],
                  status=201)
    manifest = tmp_path / "m.signed.json"
    manifest.write_text(sign(Manifest(image=IMAGE, version="2.0.0"), generate_keypair()[0]).model_dump_json())
    done = upload(url, manifest)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"software_module": 23, "distribution_set": 6}
    [sm] = recorded.sent("POST", "/rest/v1/softwaremodules")
    assert json.loads(sm[3])[0] == {"name": "edge-runtime-press", "version": "2.0.0", "type": "application",
                                    "vendor": "edge-runtime", "description": ""}
    assert sm[2]["Authorization"] == "Basic YWRtaW46YWRtaW4="  # admin:admin, from $HAWKBIT_PASSWORD
    [artifact] = recorded.sent("POST", "/rest/v1/softwaremodules/23/artifacts")
    assert b'filename="manifest.signed.json"' in artifact[3] and manifest.read_bytes().strip() in artifact[3]
    [ds] = recorded.sent("POST", "/rest/v1/distributionsets")
    assert json.loads(ds[3])[0]["modules"] == [{"id": 23}] and json.loads(ds[3])[0]["type"] == "app"


def test_an_unsigned_manifest_is_not_uploaded(served: tuple[Recorded, str], tmp_path: Path) -> None:
    recorded, url = served
    manifest = tmp_path / "m.json"
    manifest.write_text(Manifest(image=IMAGE, version="2.0.0").model_dump_json(exclude_none=True))
    done = upload(url, manifest)
    assert done.returncode == 2 and "not signed" in done.stderr and recorded.requests == []


def test_the_password_comes_from_the_environment_only(served: tuple[Recorded, str], tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(sign(Manifest(image=IMAGE, version="2.0.0"), generate_keypair()[0]).model_dump_json())
    done = upload(served[1], manifest, password=None)
    assert done.returncode == 2 and "HAWKBIT_PASSWORD" in done.stderr


def test_a_server_error_is_one_clear_line(served: tuple[Recorded, str], tmp_path: Path) -> None:
    recorded, url = served
    recorded.json("/rest/v1/softwaremodules", {"errorCode": "hawkbit.server.error.repo.entitiyAlreayExists",
                                               "message": "already exists"}, status=409)
    manifest = tmp_path / "m.json"
    manifest.write_text(sign(Manifest(image=IMAGE, version="2.0.0"), generate_keypair()[0]).model_dump_json())
    done = upload(url, manifest)
    assert done.returncode == 2 and "HTTP 409" in done.stderr and "already exists" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

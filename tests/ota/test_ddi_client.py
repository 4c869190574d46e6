"""The DDI client against a real local HTTP server serving answers shaped like hawkBit's documented
examples, the hostile ones included: each a clear, bounded failure, never a hang."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from edge_runtime.config.ota import HawkbitConfig
from edge_runtime.core import http
from edge_runtime.ota.ddi.artifact import ArtifactRefused, build_swu, manifest_from_artifact
from edge_runtime.ota.ddi.client import MAX_ANSWER_BYTES, MAX_ARTIFACT_BYTES, DdiClient, DdiError, parse_sleep
from tests.ota.ddi_server import CONTROLLER, TENANT, Recorded, controller_base, ddi_server, deployment_base

BASE_PATH = f"/{TENANT}/controller/v1/{CONTROLLER}"


@pytest.fixture
def served() -> Iterator[tuple[Recorded, str]]:
    recorded = Recorded()
    with ddi_server(recorded) as url:
        yield recorded, url


def client(url: str, **auth: Any) -> DdiClient:
    cfg = HawkbitConfig.model_validate({"url": url, "tenant": TENANT, "auth": auth, "request_timeout_s": 2})
    return DdiClient(cfg, CONTROLLER)


def test_poll_reads_the_servers_sleep_and_links(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH, sleep="12:00:00", deployment="5", config_data=True))
    base = client(url).poll()
    assert base.sleep_s == 12 * 3600
    assert base.deployment_href == f"{url}{BASE_PATH}/deploymentBase/5?c=-2127183556"
    assert base.config_data_href == f"{url}{BASE_PATH}/configData" and base.cancel_href is None


@pytest.mark.parametrize("text,seconds", [("00:00:30", 30), ("00:00:00", 1), ("99:00:00", 86400),
                                          ("soon", None), ("", None)])
def test_a_polling_sleep_is_bounded_or_ignored(text: str, seconds: float | None) -> None:
    assert parse_sleep(text) == seconds


def test_a_deployment_base_of_hawkbits_shape_gives_the_artifact(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    body = b'{"image": "x"}'
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", body))
    dep = client(url).deployment(f"{url}{BASE_PATH}/deploymentBase/8?c=1")
    assert dep.action_id == "8" and dep.update == "forced" and dep.maintenance_window == "available"
    [artifact] = dep.artifacts
    assert artifact.filename == "manifest.signed.json" and artifact.size == len(body)
    assert artifact.url.endswith("/softwaremodules/23/artifacts/manifest.signed.json")


@pytest.mark.parametrize("auth,header", [({"target_token": "t0k"}, "TargetToken t0k"),
                                         ({"gateway_token": "g4t"}, "GatewayToken g4t"), ({}, None)])
def test_the_configured_token_authenticates_every_request(served: tuple[Recorded, str], auth: dict[str, str],
                                                           header: str | None) -> None:
    recorded, url = served
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH))
    c = client(url, **auth)
    c.poll()
    c.feedback("8", "proceeding", details=["pulling"])
    c.config_data({"device_id": "press-7"})
    assert [r[2].get("Authorization") for r in recorded.requests] == [header] * 3


def test_the_token_is_not_sent_to_another_host(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    body = b'{"image": "x"}'
    other = url.replace("127.0.0.1", "localhost")  # another origin serving the artifact (a CDN)
    dep = deployment_base(other, "8", body)
    recorded.json(f"{BASE_PATH}/deploymentBase/8", dep)
    recorded.raw(f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json", body)
    c = client(url, target_token="secret")
    assert c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0]) == body
    [download] = recorded.sent("GET", "manifest.signed.json")
    assert "Authorization" not in download[2]



def test_the_token_does_not_follow_a_redirect_to_another_host(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    body = b'{"image": "x"}'
    path = f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json"
    other = url.replace("127.0.0.1", "localhost")  # the server sends the download on to a CDN / object store
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", body))
    recorded.raw(path, b"", status=302, headers={"Location": f"{other}/cdn/manifest.signed.json"})
    recorded.raw("/cdn/manifest.signed.json", body)
    c = client(url, target_token="secret")
    assert c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0]) == body
    [first] = recorded.sent("GET", path)
    [cdn] = recorded.sent("GET", "/cdn/manifest.signed.json")
    assert first[2]["Authorization"] == "TargetToken secret" and "Authorization" not in cdn[2]

def test_feedback_and_config_data_have_ddis_shape(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    c = client(url)
    c.feedback("8", "closed", "failure", ["rolled back: candidate unhealthy", "x" * 2000])
    c.feedback("11", "closed", "success", ["cancelled"], cancel=True)
    c.config_data({"device_id": "press-7", "model_bundle_sha256": "a" * 200})
    [closed] = [json.loads(r[3]) for r in recorded.sent("POST", "/deploymentBase/8/feedback")]
    assert closed["id"] == "8" and closed["status"]["execution"] == "closed"
    assert closed["status"]["result"] == {"finished": "failure"}
    assert closed["status"]["details"][0] == "rolled back: candidate unhealthy"
    assert len(closed["status"]["details"][1]) == 512  # hawkBit's limit for a status message
    assert recorded.sent("POST", "/cancelAction/11/feedback")
    [config] = [json.loads(r[3]) for r in recorded.sent("PUT", "/configData")]
    assert config["mode"] == "merge" and len(config["data"]["model_bundle_sha256"]) == 128


# ---- hostile answers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("body,expected", [
    (b"x" * (MAX_ANSWER_BYTES + 10), "larger than 256 KiB"),
    (b"<html>hello</html>", "not JSON"),
    (b'{"config": {}, "config": {}}', "not JSON"),  # duplicate key
    (b'{"config": {"polling": {"sleep": 5}}}', "malformed: config.polling.sleep"),
    (b'{"_links": {"deploymentBase": {"href": "file:///etc/passwd"}}}', "not an http(s) URL"),
    (b"[" * 5000 + b"]" * 5000, "not JSON"),
])
def test_an_oversized_or_malformed_answer_is_a_retryable_failure(served: tuple[Recorded, str], body: bytes,
                                                                 expected: str) -> None:
    recorded, url = served
    recorded.raw(BASE_PATH, body, headers={"Content-Type": "application/json"})
    with pytest.raises(DdiError, match=expected.replace("(", r"\(").replace(")", r"\)")) as err:
        client(url).poll()
    assert err.value.retry


def test_a_redirect_loop_ends_in_a_clear_failure(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    path = f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json"
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", b"{}"))
    recorded.raw(path, b"", status=302, headers={"Location": path})
    c = client(url)
    with pytest.raises(DdiError, match="more than 3 redirects") as err:
        c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0])
    assert not err.value.retry
    assert len(recorded.sent("GET", "manifest.signed.json")) == 4


def test_a_slow_drip_server_fails_within_the_deadline(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    recorded.json(BASE_PATH, controller_base(url + BASE_PATH))
    recorded.drip_s = 0.05  # ~120 bytes at one byte every 50 ms: 6 s, three times the 2 s deadline
    start = time.monotonic()
    with pytest.raises(DdiError, match="no complete answer within 2 s") as err:
        client(url).poll()
    assert time.monotonic() - start < 3.5 and err.value.retry


def test_an_artifact_larger_than_a_manifest_is_refused_before_it_is_downloaded(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", b"{}", size=2_000_000_000))
    c = client(url)
    with pytest.raises(DdiError, match="larger than a signed manifest") as err:
        c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0])
    assert not err.value.retry and not recorded.sent("GET", "manifest.signed.json")


def test_an_artifact_that_turns_out_larger_is_cut_off_and_refused(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    big = b"{" + b" " * (4 * MAX_ARTIFACT_BYTES)
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", b"{}"))  # claims 2 bytes
    recorded.raw(f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json", big)
    c = client(url)
    with pytest.raises(DdiError, match="larger than a signed manifest"):
        c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0])


def test_an_artifact_that_does_not_match_its_hash_is_refused(served: tuple[Recorded, str]) -> None:
    recorded, url = served
    recorded.json(f"{BASE_PATH}/deploymentBase/8", deployment_base(url, "8", b'{"a": 1}'))
    recorded.raw(f"{BASE_PATH}/softwaremodules/23/artifacts/manifest.signed.json", b'{"a": 2}')
    c = client(url)
    with pytest.raises(DdiError, match="does not match its sha256"):
        c.download(c.deployment(f"{url}{BASE_PATH}/deploymentBase/8").artifacts[0])


def test_an_https_server_cannot_send_the_device_to_http() -> None:
    def fake(method: str, url: str, **_: Any) -> http.Response:
        answer = controller_base("http://evil.example/DEFAULT/controller/v1/press-7", deployment="5")
        return http.Response(200, json.dumps(answer).encode(), "application/json")

    cfg = HawkbitConfig.model_validate({"url": "https://hawkbit.plant.local", "auth": {"target_token": "t"}})
    with pytest.raises(DdiError, match="http link from https"):
        DdiClient(cfg, CONTROLLER, request=fake).poll()


# ---- the artifact's format ---------------------------------------------------------------------------------

def test_a_swu_wrapper_round_trips_and_reads_like_swupdate_expects() -> None:
    manifest = b'{"image": "r@sha256:' + b"0" * 64 + b'", "version": "2.0.0"}'
    swu = build_swu(manifest, "2.0.0")
    assert manifest_from_artifact(swu) == manifest and manifest_from_artifact(manifest) == manifest
    # goosebit's reader: the first member is sw-description, its size at bytes 54..62 of the header.
    size = int(swu[54:62], 16)
    assert swu[110:125] == b"sw-description\0" and b'version = "2.0.0";' in swu[128:128 + size]


@pytest.mark.parametrize("data,reason", [(b"\x7fELF....", "neither a signed manifest"),
                                         (build_swu(b"{}", "1.0.0")[:150], "truncated"),
                                         (b"070701" + b"Z" * 200, "malformed cpio header")])
def test_an_artifact_that_is_not_ours_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ArtifactRefused, match=reason):
        manifest_from_artifact(data)

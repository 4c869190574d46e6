"""The HTTP side of hawkBit's Direct Device Integration API (DDI v1): poll the controller base, read a
deployment or a cancel request, download an artifact, send feedback and configuration data.

Everything the server sends is untrusted: every request has one overall deadline and a size limit
(`core/http.py`), answers are read by the strict JSON reader and then by lenient models (unknown
fields ignored, known ones type-checked), links may not leave https for http, and an artifact larger
than a signed manifest can be is refused before and while it is downloaded. Each failure is one
`DdiError` whose `retry` says whether trying again later may help.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_runtime.config.ota import HawkbitConfig
from edge_runtime.core import http, strict_json
from edge_runtime.ota.manifest import MAX_EVALUATION_BYTES

MAX_ANSWER_BYTES = 256 * 1024  # a controller base or deployment is a few KB, even with many chunks
# A signed manifest is a few hundred bytes plus at most the evaluation summary; the .swu wrapper some
# DDI servers need (`artifact.py`) adds a few headers. Nothing larger can be a release of ours.
MAX_ARTIFACT_BYTES = MAX_EVALUATION_BYTES + 48 * 1024
MAX_DETAIL_CHARS = 512  # hawkBit keeps status messages of at most 512 characters
MAX_DETAILS = 8
MAX_ATTRIBUTE_CHARS = 128  # hawkBit's limit for controller attribute keys and values
MIN_SLEEP_S, MAX_SLEEP_S = 1.0, 86400.0
ACTION_ID = re.compile(r"^-?[0-9A-Za-z_.]{1,64}$")
_SLEEP = re.compile(r"^(\d{1,2}):([0-5]\d):([0-5]\d)$")


class DdiError(Exception):
    """One failed DDI exchange; `retry`: trying again later may help (network, 5xx, timeouts)."""

    def __init__(self, message: str, retry: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.status = status


# ---- what the server sends (lenient: unknown fields are ignored, known ones are checked) -----------

class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Href(_Model):
    href: str = Field(max_length=4096)


class _Polling(_Model):
    sleep: str = Field("", max_length=16)


class _Config(_Model):
    polling: _Polling = Field(default_factory=_Polling)


class _Links(_Model):
    deploymentBase: _Href | None = None
    cancelAction: _Href | None = None
    configData: _Href | None = None


class _Base(_Model):
    config: _Config = Field(default_factory=_Config)
    links: _Links = Field(default_factory=_Links, alias="_links")


class _ArtifactLinks(_Model):
    download: _Href | None = None
    download_http: _Href | None = Field(None, alias="download-http")


class _Artifact(_Model):
    filename: str = Field(max_length=256)
    hashes: dict[str, str] = Field(default_factory=dict, max_length=8)
    size: int | None = Field(None, ge=0)
    links: _ArtifactLinks = Field(default_factory=_ArtifactLinks, alias="_links")


class _Chunk(_Model):
    part: str = Field("", max_length=128)
    version: str = Field("", max_length=128)
    name: str = Field("", max_length=256)
    artifacts: list[_Artifact] = Field(default_factory=list, max_length=16)


class _Deployment(_Model):
    download: str = Field("forced", max_length=16)
    update: str = Field("forced", max_length=16)
    maintenanceWindow: str | None = Field(None, max_length=16)
    chunks: list[_Chunk] = Field(default_factory=list, max_length=16)


class _DeploymentBase(_Model):
    id: str = Field(max_length=64)
    deployment: _Deployment


class _StopAction(_Model):
    stopId: str = Field(max_length=64)


class _Cancel(_Model):
    id: str = Field(max_length=64)
    cancelAction: _StopAction


# ---- what the agent works with ------------------------------------------------------------------------

@dataclass(frozen=True)
class ControllerBase:
    sleep_s: float | None  # the server's polling interval, None when it sent none (or nonsense)
    deployment_href: str | None
    cancel_href: str | None
    config_data_href: str | None


@dataclass(frozen=True)
class Artifact:
    filename: str
    size: int | None
    url: str
    sha256: str | None
    sha1: str | None


@dataclass(frozen=True)
class Deployment:
    action_id: str
    update: str  # forced | attempt | skip (skip: download only)
    maintenance_window: str | None  # available | unavailable | None
    artifacts: list[Artifact]


@dataclass(frozen=True)
class CancelRequest:
    action_id: str
    stop_id: str


def parse_sleep(text: str) -> float | None:
    """hawkBit's 'HH:MM:SS' polling sleep in seconds, kept within [1 s, 24 h]; None if it is not one."""
    m = _SLEEP.match(text)
    if m is None:
        return None
    seconds = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
    return min(max(float(seconds), MIN_SLEEP_S), MAX_SLEEP_S)


def _check_id(value: str, what: str) -> str:
    if not ACTION_ID.match(value):
        raise DdiError(f"the server sent an unusable {what} {strict_json.shown(value, 40)!r}", retry=True)
    return value


class DdiClient:
    """One device's DDI conversation with one server (`ota.hawkbit`)."""

    def __init__(self, cfg: HawkbitConfig, controller_id: str,
                 request: Callable[..., http.Response] = http.request) -> None:
        self.cfg = cfg
        self.base = f"{cfg.url.rstrip('/')}/{cfg.tenant}/controller/v1/{urllib.parse.quote(controller_id)}"
        self._origin = urllib.parse.urlsplit(cfg.url)
        self._request = request
        self.requests = 0  # every request sent, for the idle-cost figure in docs/ota.md
        auth = cfg.auth
        self._auth: dict[str, str] = {}
        if auth.target_token is not None:
            self._auth["Authorization"] = f"TargetToken {auth.target_token.get_secret_value()}"
        elif auth.gateway_token is not None:
            self._auth["Authorization"] = f"GatewayToken {auth.gateway_token.get_secret_value()}"

    # ---- reads -------------------------------------------------------------------------------------

    def poll(self) -> ControllerBase:
        base = self._read(self.base, _Base, "controller base")
        links = base.links
        return ControllerBase(
            sleep_s=parse_sleep(base.config.polling.sleep),
            deployment_href=self._link(links.deploymentBase),
            cancel_href=self._link(links.cancelAction),
            config_data_href=self._link(links.configData))

    def deployment(self, href: str) -> Deployment:
        base = self._read(href, _DeploymentBase, "deploymentBase")
        artifacts = []
        for chunk in base.deployment.chunks:
            for a in chunk.artifacts:
                https = self._origin.scheme == "https"
                link = a.links.download if https else (a.links.download_http or a.links.download)
                url = self._link(link)
                if url is None:
                    raise DdiError(f"artifact {a.filename!r} has no download link this device may use", retry=False)
                hashes = {k.lower(): v.lower() for k, v in a.hashes.items()}
                artifacts.append(Artifact(a.filename, a.size, url, hashes.get("sha256"), hashes.get("sha1")))
        return Deployment(_check_id(base.id, "action id"), base.deployment.update.lower(),
                          (base.deployment.maintenanceWindow or "").lower() or None, artifacts)

    def cancel_action(self, href: str) -> CancelRequest:
        cancel = self._read(href, _Cancel, "cancelAction")
        return CancelRequest(_check_id(cancel.id, "action id"), _check_id(cancel.cancelAction.stopId, "stop id"))

    def download(self, artifact: Artifact) -> bytes:
        """The artifact's bytes, at most MAX_ARTIFACT_BYTES, checked against the hash the server gave."""
        if artifact.size is not None and artifact.size > MAX_ARTIFACT_BYTES:
            raise DdiError(f"artifact {artifact.filename!r} has {artifact.size} bytes: larger than a signed "
                           f"manifest can be ({MAX_ARTIFACT_BYTES} bytes)", retry=False)
        body = self._send("GET", artifact.url, None, MAX_ARTIFACT_BYTES, follow_redirects=True).body
        if len(body) > MAX_ARTIFACT_BYTES:
            raise DdiError(f"artifact {artifact.filename!r} is larger than a signed manifest can be "
                           f"({MAX_ARTIFACT_BYTES} bytes)", retry=False)
        for name, expected in (("sha256", artifact.sha256), ("sha1", artifact.sha1)):
            if expected:  # the strongest the server gave; the manifest's signature is what is trusted
                if hashlib.new(name, body).hexdigest() != expected:
                    raise DdiError(f"artifact {artifact.filename!r} does not match its {name} "
                                   "(a broken or altered download)", retry=True)
                break
        return body

    # ---- writes ------------------------------------------------------------------------------------

    def feedback(self, action_id: str, execution: str, finished: str = "none", details: list[str] | None = None,
                 cancel: bool = False) -> None:
        """POST a status of the action (`cancel`: of the cancel request for it)."""
        resource = "cancelAction" if cancel else "deploymentBase"
        body = {"id": action_id, "time": time.strftime("%Y%m%dT%H%M%S", time.gmtime()),
                "status": {"execution": execution, "result": {"finished": finished},
                           "details": [d[:MAX_DETAIL_CHARS] for d in (details or [])][:MAX_DETAILS]}}
        self._write("POST", f"{self.base}/{resource}/{urllib.parse.quote(action_id)}/feedback", body)

    def config_data(self, data: dict[str, str]) -> None:
        attributes = {k[:MAX_ATTRIBUTE_CHARS]: str(v)[:MAX_ATTRIBUTE_CHARS] for k, v in data.items()}
        self._write("PUT", f"{self.base}/configData", {"mode": "merge", "data": attributes})

    # ---- plumbing ----------------------------------------------------------------------------------

    def _link(self, link: _Href | None) -> str | None:
        """A server-sent URL, or None; http links are refused when the server is https (the token would
        travel in clear)."""
        if link is None:
            return None
        parts = urllib.parse.urlsplit(link.href)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DdiError(f"the server sent a link that is not an http(s) URL: {strict_json.shown(link.href)}",
                           retry=True)
        if self._origin.scheme == "https" and parts.scheme != "https":
            raise DdiError(f"the server sent an http link from https: {strict_json.shown(link.href)}", retry=True)
        return link.href

    def _headers(self, url: str, json_body: bool = False) -> dict[str, str]:
        headers = {"Accept": "application/hal+json, application/json", "User-Agent": "edge-runtime-ota"}
        if json_body:
            headers["Content-Type"] = "application/json"
        parts = urllib.parse.urlsplit(url)
        if (parts.scheme, parts.netloc) == (self._origin.scheme, self._origin.netloc):
            headers.update(self._auth)  # never hand the device's token to another host (a CDN link)
        return headers

    def _send(self, method: str, url: str, body: bytes | None, limit: int,
              follow_redirects: bool = False) -> http.Response:
        self.requests += 1
        try:
            return self._request(method, url, timeout_s=self.cfg.request_timeout_s, limit=limit, body=body,
                                 headers=self._headers(url, body is not None), follow_redirects=follow_redirects)
        except http.HttpFailure as exc:
            # 404/410: the action is gone on the server; other 4xx will not pass by retrying either.
            raise DdiError(str(exc), retry=exc.retry, status=exc.status) from None

    def _read(self, url: str, model: type[Any], what: str) -> Any:
        body = self._send("GET", url, None, MAX_ANSWER_BYTES).body
        if len(body) > MAX_ANSWER_BYTES:
            raise DdiError(f"the {what} answer is larger than {MAX_ANSWER_BYTES // 1024} KiB", retry=True)
        try:
            return model.model_validate(strict_json.loads(body, max_depth=16))
        except strict_json.StrictJsonError as exc:
            raise DdiError(f"the {what} answer is not JSON: {exc}", retry=True) from None
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise DdiError(f"the {what} answer is malformed: {where}: {err['msg']}", retry=True) from None

    def _write(self, method: str, url: str, payload: dict[str, Any]) -> None:
        self._send(method, url, json.dumps(payload).encode(), 4096)

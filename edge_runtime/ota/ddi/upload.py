"""`edge-runtime ota hawkbit-upload`: put a signed manifest into a DDI server as a release.

- Eclipse hawkBit (Management API, HTTP Basic): a software module (name = --module, version = the
  manifest's) with the manifest as its artifact, then a distribution set holding that module. A
  rollout then targets the set (docs/ota.md shows one of 3 groups with thresholds).
- goosebit (its own API, a bearer token from /login): the manifest wrapped in a `.swu` (goosebit
  stores only .swu/RAUC bundles, `artifact.py`); its rollouts target a feed.

The manifest is checked to be one of ours (parsed, signed) before anything is sent; the devices verify
the signature themselves, so nothing here is trusted by them.
"""

from __future__ import annotations

import base64
import json
import secrets
import urllib.parse
from typing import Any

from edge_runtime.core import http, strict_json
from edge_runtime.core.errors import EdgeRuntimeError
from edge_runtime.ota.ddi.artifact import SWU_MANIFEST, build_swu
from edge_runtime.ota.ddi.client import MAX_ARTIFACT_BYTES
from edge_runtime.ota.manifest import ManifestRefused, parse

TIMEOUT_S = 60.0
MAX_ANSWER = 1 << 20


def _multipart(field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "edge-runtime-" + secrets.token_hex(12)
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _call(method: str, url: str, headers: dict[str, str], body: bytes | None = None,
          content_type: str = "application/json") -> Any:
    try:
        resp = http.request(method, url, timeout_s=TIMEOUT_S, limit=MAX_ANSWER, body=body,
                            headers={**headers, "Accept": "application/json",
                                     **({"Content-Type": content_type} if body is not None else {})})
    except http.HttpFailure as exc:
        raise EdgeRuntimeError(f"{method} {url}: {exc}") from None
    try:
        return strict_json.loads(resp.body, max_depth=32) if resp.body.strip() else None
    except strict_json.StrictJsonError as exc:
        raise EdgeRuntimeError(f"{method} {url}: the answer is not JSON ({exc})") from None


def _first_id(answer: Any, what: str) -> int:
    item = answer[0] if isinstance(answer, list) and answer else answer
    if not isinstance(item, dict) or not isinstance(item.get("id"), int):
        raise EdgeRuntimeError(f"the server's answer names no {what} id: {str(answer)[:200]}")
    return int(item["id"])


def read_release(path: str) -> tuple[bytes, str, str]:
    """(bytes, version, notes) of a signed manifest file, or a one-line user error."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_ARTIFACT_BYTES + 1)
    except OSError as exc:
        raise EdgeRuntimeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise EdgeRuntimeError(f"{path}: larger than a signed manifest can be ({MAX_ARTIFACT_BYTES} bytes)")
    try:
        manifest = parse(raw)
    except ManifestRefused as exc:
        raise EdgeRuntimeError(f"{path}: {exc}") from None
    if not manifest.signature:
        raise EdgeRuntimeError(f"{path}: not signed (edge-runtime ota sign first): devices would refuse it")
    return raw, manifest.version, manifest.notes


def upload_hawkbit(url: str, user: str, password: str, module: str, manifest_path: str,
                   module_type: str = "application", ds_type: str = "app") -> dict[str, int]:
    raw, version, notes = read_release(manifest_path)
    rest = url.rstrip("/") + "/rest/v1"
    auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    sm = _first_id(_call("POST", f"{rest}/softwaremodules", auth, json.dumps([{
        "name": module, "version": version, "type": module_type, "vendor": "edge-runtime",
        "description": notes[:512]}]).encode()), "software module")
    body, ctype = _multipart("file", SWU_MANIFEST, raw)
    _call("POST", f"{rest}/softwaremodules/{sm}/artifacts", auth, body, ctype)
    ds = _first_id(_call("POST", f"{rest}/distributionsets", auth, json.dumps([{
        "name": module, "version": version, "type": ds_type, "description": notes[:512],
        "modules": [{"id": sm}]}]).encode()), "distribution set")
    return {"software_module": sm, "distribution_set": ds}


def upload_goosebit(url: str, user: str, password: str, manifest_path: str) -> dict[str, int]:
    raw, version, _notes = read_release(manifest_path)
    base = url.rstrip("/")
    form = urllib.parse.urlencode({"username": user, "password": password}).encode()
    token = _call("POST", f"{base}/login", {}, form, "application/x-www-form-urlencoded")
    if not isinstance(token, dict) or not isinstance(token.get("access_token"), str):
        raise EdgeRuntimeError(f"{base}/login: no access token in the answer")
    body, ctype = _multipart("file", f"edge-runtime-{version}.swu", build_swu(raw, version))
    software = _call("PUT", f"{base}/api/v1/software", {"Authorization": f"Bearer {token['access_token']}"},
                     body, ctype)
    return {"software": _first_id(software, "software")}

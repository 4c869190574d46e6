"""Remote commands (MQTT `<prefix>/cmd/<name>`): validated payloads in, JSON-able replies out.

Each handler takes the decoded payload (without the correlation `id`) and returns the reply's
`result`; a wrong payload raises CommandError with a message for the caller. A later component
adds its own command by putting a handler in the table (the OTA agent registers `ota`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_runtime.core.device import DeviceRoles


class CommandError(Exception):
    """A remote command's payload is wrong; the message goes back in the MQTT error reply."""



class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TriggerPayload(_Payload):
    camera: str = Field(description="Camera to inspect now.")
    prompt: str | None = Field(None, max_length=2000, description="Question for this inspection.")
    timeout_s: float = Field(30, gt=0, le=300, description="How long to wait for the verdict.")


class EmptyPayload(_Payload):
    pass


def _parse(model: type[_Payload], payload: dict[str, Any]) -> Any:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "payload"
        raise CommandError(f"{field}: {err['msg']}") from None


def command_table(device: DeviceRoles) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    def trigger(payload: dict[str, Any]) -> dict[str, Any]:
        req = _parse(TriggerPayload, payload)
        future = device.cameras.trigger(req.camera, req.prompt)
        try:
            result = future.result(timeout=req.timeout_s)
        except FutureTimeout:
            raise CommandError(f"no verdict within {req.timeout_s} s; it will still be published") from None
        return {"result_id": result.id, "camera": result.camera, "verdict": result.verdict}

    def reload(payload: dict[str, Any]) -> dict[str, Any]:
        _parse(EmptyPayload, payload)
        outcome = device.control.reload()  # a refused file raises: the reply carries its one-line error
        return {"cameras": device.status.camera_names(), **outcome}

    def status(payload: dict[str, Any]) -> dict[str, Any]:
        _parse(EmptyPayload, payload)
        return device.status.status()

    return {"trigger": trigger, "reload": reload, "status": status}

"""The `offload:` section: central endpoints, when offload engages, retries, breaker, fallback."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

VerdictValue = str | int | float | bool | None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointConfig(_Section):
    url: str = Field(
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=2048,
        description="OpenAI-compatible base URL, as OpenAI clients take it, e.g. http://central:8000/v1 "
        "(vLLM, llama-server, or another edge-runtime); requests go to <url>/chat/completions.")
    model: str | None = Field(
        None, max_length=256, description="Model name sent with each request (vLLM: the served model, e.g. "
        "Qwen/Qwen2.5-VL-7B-Instruct). Empty: not sent; the server's default answers.")
    api_key: SecretStr | None = Field(
        None, description="Bearer token for the endpoint; write ${ENV_NAME} (an environment variable or a "
        "systemd credential of that name), never plain text. Never logged.")
    timeout_s: float = Field(15, gt=0, le=600, description="Seconds one request may take (connect + answer).")


class RetryConfig(_Section):
    attempts: int = Field(2, ge=1, le=10, description="Tries per endpoint for one frame (timeouts, refused "
                          "connections, 5xx and 429 are retried; other 4xx are not).")
    backoff_s: float = Field(0.2, ge=0, le=60, description="Wait before the second try; doubles each try.")
    backoff_max_s: float = Field(2, ge=0, le=600, description="Longest wait between two tries.")


class BreakerConfig(_Section):
    failures: int = Field(3, ge=1, le=1000, description="Consecutive failed requests that open an "
                          "endpoint's circuit (no requests go to it while open).")
    open_s: float = Field(10, gt=0, le=3600, description="Seconds an open circuit waits before one "
                          "half-open probe request; its success closes the circuit, its failure re-opens it.")


class EngageConfig(_Section):
    queue_full: bool = Field(False, description="Send a camera's frame to the central server when the local "
                             "inspection queue refuses it (instead of skipping it).")
    governor: bool = Field(False, description="Send frames to the central server while the governor has "
                           "paused or throttled local inspection (over its thermal or power budget).")


class EscalateConfig(_Section):
    when: dict[str, VerdictValue] = Field(
        min_length=1, max_length=16, description="Ask the central server for a second opinion when every "
        "listed top-level verdict field equals its value, e.g. {defect: true}. The second opinion is "
        "journaled as its own result with source.second_opinion_of set to the local result's id.")
    max_held_mb: int = Field(
        64, ge=1, le=1024, description="MiB the frames waiting for their local verdict (to be escalated if "
        "it matches) may pin, a crop counting the whole frame it keeps alive; at most 64 frames "
        "are held. Beyond either bound the oldest is let go, counted in images_evicted, and its "
        "verdict is not escalated. Keep it small on a device whose memory the GPU shares (Jetson).")


class OffloadConfig(_Section):
    enabled: bool = Field(False, description="Offload and escalate to the endpoints below.")
    endpoints: list[EndpointConfig] = Field(
        default_factory=list, max_length=16,
        description="Central OpenAI-compatible servers, tried in this order (the next one when a request "
        "fails or its circuit is open).")
    engage: EngageConfig = Field(default_factory=EngageConfig, description="When frames go to the central "
                                 "server (besides cameras set to remote: true).")
    escalate: EscalateConfig | None = Field(None, description="Second opinions on local verdicts (empty: none).")
    fallback: Literal["local", "drop"] = Field(
        "local", description="When every endpoint fails or is open: local inspects the frame here "
        "(unless the governor has paused inspection), drop discards it; both are counted.")
    retry: RetryConfig = Field(default_factory=RetryConfig, description="Retries per endpoint.")
    breaker: BreakerConfig = Field(default_factory=BreakerConfig, description="Circuit breaker per endpoint.")
    queue_size: int = Field(8, ge=1, le=1024, description="Frames waiting for an offload worker; a frame "
                            "that finds it full takes the fallback at once (capture never waits).")
    workers: int = Field(2, ge=1, le=64, description="Concurrent requests to the central servers.")
    max_tokens: int = Field(256, ge=16, le=8192, description="max_tokens of each remote request.")
    jpeg_quality: int = Field(85, ge=10, le=100, description="JPEG quality of the frames sent.")
    max_image_side: int = Field(1280, ge=64, le=8192, description="Frames are scaled down to this longest "
                                "side before sending (bounds the request size).")
    max_response_kb: int = Field(256, ge=1, le=65536, description="Answers larger than this are refused "
                                 "(a failure of the endpoint).")

    @model_validator(mode="after")
    def _endpoints_when_enabled(self) -> OffloadConfig:
        if self.enabled and not self.endpoints:
            raise ValueError("offload.enabled needs at least one entry in offload.endpoints")
        return self

"""`mqtt:`: the broker connection, TLS and Home Assistant discovery."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from edge_runtime.config.base import ConfigPath, Section, check_topic


class TlsConfig(Section):
    enabled: bool = Field(False, description="Connect over TLS.")
    ca_file: ConfigPath | None = Field(None, description="CA bundle that signed the broker's certificate "
                                 "(default: the system store).")
    cert_file: ConfigPath | None = Field(None, description="Client certificate for mutual TLS.")
    key_file: ConfigPath | None = Field(None, description="Client private key for mutual TLS.")
    insecure: bool = Field(False, description="Skip broker hostname verification (testing only).")


class HomeAssistantConfig(Section):
    enabled: bool = Field(False, description="Publish Home Assistant MQTT discovery configs.")
    discovery_prefix: str = Field("homeassistant", description="Home Assistant's discovery prefix.")

    @field_validator("discovery_prefix")
    @classmethod
    def _topic_safe(cls, v: str) -> str:
        return check_topic(v, "discovery prefix")


class MqttConfig(Section):
    enabled: bool = Field(True, description="Publish results over MQTT (the daemon runs without a broker).")
    host: str = Field("localhost", description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker port (8883 is usual for TLS).")
    client_id: str | None = Field(None, description="Client id (default: edge-runtime-<device_id>).")
    keepalive: int = Field(30, ge=5, le=3600, description="Seconds between keep-alive pings.")
    clean_session: bool = Field(True, description="false keeps the broker-side session (and the "
                                "command subscription) across reconnects.")
    username: str | None = Field(None, description="Broker user name.")
    password: SecretStr | None = Field(None, description="Broker password; use ${ENV} or a systemd "
                                       "credential, never plain text. Never logged.")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="TLS settings.")
    topic_prefix: str | None = Field(None, description="Topic prefix (default: edge/<device_id>).")
    qos: Literal[0, 1, 2] = Field(1, description="QoS of result messages.")
    max_inflight: int = Field(20, ge=1, le=1000, description="Results published but not yet acknowledged.")
    telemetry_interval_s: float = Field(10, ge=1, description="Seconds between telemetry messages.")
    homeassistant: HomeAssistantConfig = Field(default_factory=HomeAssistantConfig,
                                               description="Home Assistant discovery.")

    @field_validator("topic_prefix")
    @classmethod
    def _topic_safe(cls, v: str | None) -> str | None:
        return v if v is None else check_topic(v, "topic prefix")

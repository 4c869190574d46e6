"""The protocols of `line_io:`: the servers a line's PLCs and SCADA talk to (OPC UA, Modbus TCP, Sparkplug B)
and GPIO cells, each off unless configured; the stations they serve are line_io.py's."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from edge_runtime.config.base import NAME, ConfigPath, Section


class ModbusConfig(Section):
    """Modbus TCP server for PLCs (off by default); the register map is in docs/line-io.md."""

    enabled: bool = Field(False, description="Serve the stations' register map over Modbus TCP.")
    host: str = Field("127.0.0.1", description="Address of the interface to listen on (the line network's "
                      "address of this device; 0.0.0.0 listens on every interface).")
    port: int = Field(502, ge=0, le=65535, description="TCP port (502 is Modbus's; below 1024 needs "
                      "CAP_NET_BIND_SERVICE; 0 picks a free one).")
    allow: list[str] = Field(
        default_factory=lambda: ["127.0.0.1/32", "::1/128"], min_length=1, max_length=64,
        description="Client addresses or networks (CIDR) allowed to connect; a connection from any "
                    "other address is closed at once.")
    max_clients: int = Field(4, ge=1, le=64, description=(
        "Connections held at once. When all are held, a new one from an allowed address takes the place of "
        "the connection silent longest (no request for at least 1 s, none in progress); if none is, the new "
        "one is closed. A connection without a request for 60 s is closed anyway."))
    stride: int = Field(100, ge=100, le=1000, description="Registers between two stations' blocks "
                        "(station n starts at n * stride).")

    @field_validator("allow")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for item in v:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"allow: {item!r} is not an IP address or network (e.g. 10.0.5.0/24)") from None
        return v


SecurityMode = Literal["sign", "sign_and_encrypt", "none"]


def _secure_by_default() -> list[SecurityMode]:
    return ["sign", "sign_and_encrypt"]


class OpcUaUser(Section):
    """One OPC UA user; the password is stored only as a scrypt hash."""

    name: str = Field(pattern=NAME, description="User name the client logs in with.")
    password_hash: str = Field(pattern=r"^scrypt\$\d{1,7}\$\d{1,2}\$\d{1,2}\$[0-9a-f]{32}\$[0-9a-f]{64}$",
                               description="scrypt$N$r$p$salt$hash, as `python -m edge_runtime.lineio.passwords` "
                                           "prints it; never the plain password.")


class OpcUaConfig(Section):
    """The OPC UA server (shaped after OPC 40100 Machine Vision); secure by default (docs/line-io.md)."""

    enabled: bool = Field(False, description="Serve the stations over OPC UA.")
    host: str = Field("127.0.0.1", max_length=255, description="Address to bind: the line network's interface "
                      "(0.0.0.0 for all).")
    port: int = Field(4840, ge=1, le=65535, description="TCP port (4840 is OPC UA's).")
    security: list[SecurityMode] = Field(
        default_factory=_secure_by_default, min_length=1, max_length=3,
        description="Basic256Sha256 Sign and SignAndEncrypt by default; 'none' (no security at all) only when "
                    "listed here, and the server warns at every start.")
    pki_dir: ConfigPath | None = Field(None, description="Certificates: own/ (generated on first start), trusted/ "
                                 "(client certificates to accept), rejected/ (refused ones, to move by hand). "
                                 "Default <data_dir>/opcua.")
    users: list[OpcUaUser] = Field(default_factory=list, max_length=64, description="Users who may log in.")
    anonymous: bool = Field(False, description="Also accept clients without a user (not recommended).")
    application_uri: str | None = Field(None, max_length=200, pattern=r"^urn:[\x21-\x7e]+$",
                                        description="Server application URI (default urn:<device_id>:edge-runtime).")
    max_clients: int = Field(16, ge=1, le=256, description="TCP connections at once (a line has a few PLCs "
                             "and SCADA clients; asyncua's own limit is 1000).")

    @model_validator(mode="after")
    def _someone_can_log_in(self) -> OpcUaConfig:
        if self.enabled and not self.users and not self.anonymous:
            raise ValueError("opcua: give at least one user (or anonymous: true) so a client can log in")
        names = [u.name for u in self.users]
        if len(set(names)) != len(names):
            raise ValueError("opcua: user names must be unique")
        return self


class SparkplugConfig(Section):
    """Sparkplug B edge node on the mqtt: broker (its own connection: the Will is its NDEATH)."""

    enabled: bool = Field(False, description="Publish the stations as Sparkplug B devices of one edge node.")
    group_id: str = Field("edge-runtime", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                          description="Sparkplug group id (spBv1.0/<group_id>/...).")
    edge_node_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                                     description="Edge node id (default: the device id).")
    max_pending: int = Field(256, ge=8, le=65536, description="Signal changes per station waiting to be "
                             "published as DDATA; older ones are dropped (counted) beyond it.")
    max_command_bytes: int = Field(16384, ge=256, le=1_048_576, description="Largest NCMD/DCMD payload "
                                   "decoded; bigger ones are refused (counted).")
    device_commands: bool = Field(
        False, description="Accept DCMD writes (Trigger, PartId, Recipe, TriggerEnable, ResultAck, "
        "InspectionSeq) from any client the broker lets publish to this node's DCMD topics. Off: only NCMD "
        "Rebirth is obeyed. Turn on only where the broker's ACL limits who may publish there: a DCMD "
        "ResultAck clears a result before a PLC on OPC UA or Modbus has read it.")


class GpioCellConfig(Section):
    """One simple cell on GPIO lines: a trigger input and OK/NOK outputs for one station."""

    station: str = Field(pattern=NAME, description="The station these lines serve.")
    trigger_line: int = Field(ge=0, le=1023, description="Line offset of the trigger input on the chip.")
    trigger_active_low: bool = Field(False, description="The trigger is active when the line is low "
                                     "(an opto-isolated input that pulls the line down).")
    bias: Literal["as_is", "pull_up", "pull_down", "disabled"] = Field(
        "as_is", description="Bias of the trigger input (pull_up for an open-collector opto output).")
    debounce_ms: float = Field(5, ge=0, le=1000, description="The trigger level must hold this long "
                               "before an edge counts (contact bounce, noise).")
    ok_line: int | None = Field(None, ge=0, le=1023, description="Output line set for an OK result.")
    nok_line: int | None = Field(None, ge=0, le=1023, description="Output line set for a NOK or ERROR "
                                 "result (the PLC times the reject, never this device).")
    output_active_low: bool = Field(False, description="Outputs drive the line low when active.")
    output_mode: Literal["pulse", "level"] = Field(
        "pulse", description="pulse: the output is active pulse_ms per result; level: it holds the "
                             "result until the next trigger.")
    pulse_ms: int = Field(50, ge=1, le=10_000, description="Length of an output pulse.")
    gap_ms: int | None = Field(None, ge=1, le=10_000, description="pulse mode: the outputs stay low at "
                               "least this long between two pulses, so results that come close together "
                               "stay distinct pulses (default: pulse_ms).")
    auto_ack: bool = Field(True, description="Acknowledge each result once it has been signalled (level: "
                           "set; pulse: its pulse has ended), as a simple cell has no ResultAck wire; the "
                           "FIFO holds only results not yet signalled.")

    @model_validator(mode="after")
    def _distinct(self) -> GpioCellConfig:
        lines = [x for x in (self.trigger_line, self.ok_line, self.nok_line) if x is not None]
        if len(set(lines)) != len(lines):
            raise ValueError("gpio: trigger_line, ok_line and nok_line must be different lines")
        return self


class GpioConfig(Section):
    """Trigger input and result outputs on GPIO (libgpiod v2), for cells without a PLC protocol."""

    enabled: bool = Field(False, description="Drive the cells below through the GPIO character device.")
    chip: str = Field("/dev/gpiochip0", pattern=r"^/dev/gpiochip[0-9]{1,3}$|^gpiochip[0-9]{1,3}$",
                      description="The GPIO chip (the Jetson 40-pin header is on /dev/gpiochip0; check "
                                  "with gpioinfo).")
    cells: list[GpioCellConfig] = Field(default_factory=list, max_length=16, description="One per station.")

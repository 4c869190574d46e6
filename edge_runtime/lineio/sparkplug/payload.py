"""Sparkplug B payloads of a station: the metric table, births, DDATA diffs, and command decoding.

Every station is one Sparkplug device. Its metrics are the station's signals (read-only), plus
`LastRefusal` and the two writable command metrics `Trigger` and `ResultAck`; a DCMD may also carry
`TriggerEnable`, `PartId` and `Recipe` (they take effect before the Trigger of the same message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_runtime.lineio.signals import Signals
from edge_runtime.lineio.sparkplug import sparkplug_b_pb2 as pb

NAMESPACE = "spBv1.0"
BDSEQ = "bdSeq"
REBIRTH = "Node Control/Rebirth"

# Sparkplug datatypes (spec 6.4.16) we use, and the Metric field each one travels in.
BOOLEAN, STRING, INT32, UINT32, UINT64 = pb.Boolean, pb.String, pb.Int32, pb.UInt32, pb.UInt64


@dataclass(frozen=True)
class MetricSpec:
    name: str
    datatype: int
    value: Callable[[Signals], Any]


STATION_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("TriggerEnable", BOOLEAN, lambda s: s.trigger_enable),
    MetricSpec("Ready", BOOLEAN, lambda s: s.ready),
    MetricSpec("TriggerAck", BOOLEAN, lambda s: s.trigger_ack),
    MetricSpec("Busy", BOOLEAN, lambda s: s.busy),
    MetricSpec("AcquisitionDone", BOOLEAN, lambda s: s.acquisition_done),
    MetricSpec("ResultValid", BOOLEAN, lambda s: s.result_valid),
    MetricSpec("InspectionSeq", UINT64, lambda s: s.inspection_seq),
    MetricSpec("PartId", STRING, lambda s: s.part_id),
    MetricSpec("Recipe", STRING, lambda s: s.recipe),
    MetricSpec("Result", INT32, lambda s: int(s.result)),
    MetricSpec("DefectCode", INT32, lambda s: s.defect_code),
    MetricSpec("Heartbeat", UINT32, lambda s: s.heartbeat),
    MetricSpec("Fault", BOOLEAN, lambda s: s.fault),
    MetricSpec("BufferCount", UINT32, lambda s: s.buffer_count),
    MetricSpec("Overrun", BOOLEAN, lambda s: s.overrun),
)
# Writable by a host application (DCMD); in DBIRTH and DDATA with the level the host last wrote.
COMMAND_METRICS = (("Trigger", BOOLEAN), ("ResultAck", BOOLEAN))


def now_ms() -> int:
    return int(time.time() * 1000)


def _set(metric: pb.Payload.Metric, datatype: int, value: Any) -> None:
    metric.datatype = datatype
    if datatype == BOOLEAN:
        metric.boolean_value = bool(value)
    elif datatype == STRING:
        metric.string_value = str(value)
    elif datatype == UINT64:
        metric.long_value = int(value) & 0xFFFFFFFFFFFFFFFF
    else:  # Int32 and UInt32 travel in int_value (uint32; signed ones as two's complement)
        metric.int_value = int(value) & 0xFFFFFFFF


def payload(seq: int | None, metrics: list[tuple[str, int, Any]], ts: int | None = None) -> bytes:
    """One encoded Payload; `seq` None for NDEATH (which carries none)."""
    ts = now_ms() if ts is None else ts
    p = pb.Payload(timestamp=ts)
    if seq is not None:
        p.seq = seq
    for name, datatype, value in metrics:
        m = p.metrics.add(name=name, timestamp=ts)
        _set(m, datatype, value)
    return p.SerializeToString()


def node_birth(seq: int, bdseq: int) -> bytes:
    return payload(seq, [(BDSEQ, UINT64, bdseq), (REBIRTH, BOOLEAN, False)])


def node_death(bdseq: int) -> bytes:
    return payload(None, [(BDSEQ, UINT64, bdseq)])


def station_values(s: Signals, last_refusal: str, trigger: bool = False,
                   result_ack: bool = False) -> dict[str, tuple[int, Any]]:
    """The device's metrics: the station's signals, LastRefusal, and the levels of the command metrics
    (`Trigger`, `ResultAck`) as the host last wrote them (a true must go false before the next edge)."""
    values = {m.name: (m.datatype, m.value(s)) for m in STATION_METRICS}
    values["LastRefusal"] = (STRING, last_refusal)
    levels = {"Trigger": trigger, "ResultAck": result_ack}
    for name, dt in COMMAND_METRICS:
        values[name] = (dt, levels[name])
    return values


def device_birth(seq: int, values: dict[str, tuple[int, Any]]) -> bytes:
    return payload(seq, [(name, dt, v) for name, (dt, v) in values.items()])


def device_data(seq: int, old: dict[str, tuple[int, Any]], new: dict[str, tuple[int, Any]]) -> bytes | None:
    """DDATA with only the metrics that changed (report by exception); None when nothing did."""
    changed = [(name, dt, v) for name, (dt, v) in new.items() if old.get(name) != (dt, v)]
    return payload(seq, changed) if changed else None


class CommandError(ValueError):
    """A command metric of the wrong type or name; the message names it."""


def decode_command(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """The metrics of an NCMD/DCMD as {name: value}; refuses oversized or undecodable payloads."""
    if len(raw) > max_bytes:
        raise CommandError(f"payload of {len(raw)} bytes is over the {max_bytes} byte limit")
    p = pb.Payload()
    try:
        p.ParseFromString(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and others for garbage
        raise CommandError(f"not a Sparkplug B payload: {exc}") from None
    out: dict[str, Any] = {}
    for m in p.metrics[:64]:
        field = m.WhichOneof("value")
        out[m.name] = None if field is None else getattr(m, field)
    return out


def decode(raw: bytes) -> pb.Payload:
    """Decode a payload (tests and tools)."""
    p = pb.Payload()
    p.ParseFromString(raw)
    return p


def metric_values(p: pb.Payload) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in p.metrics:
        field = m.WhichOneof("value")
        out[m.name] = None if field is None else getattr(m, field)
    return out

"""The OPC UA server of the stations (asyncua), its address space shaped after OPC 40100 (Machine Vision).

Objects/EdgeRuntime/<station> holds, per station:
- methods `StartSingleJob(PartId, RecipeId) -> JobId` and `ResultAck(JobId) -> Boolean`,
- the line's writable inputs `TriggerEnable`, `Trigger` (rising edge with `PartIdIn`/`RecipeIdIn`),
  `ResultAckIn` (rising edge acknowledges the FIFO head),
- the read-only signals `Ready`, `TriggerAck`, `Busy`, `AcquisitionDone`, `ResultValid`,
  `InspectionSeq`, `PartId`, `RecipeId`, `Result`, `DefectCode`, `Heartbeat`, `Fault`, `BufferCount`,
  `Overrun`, `LastRefusal`,
- a `ResultReadyEventType` event each time a result becomes valid at the FIFO head.
Secure by default: Basic256Sha256 Sign / SignAndEncrypt, trusted client certificates, configured users
(pki.py), enforced on every connection (guard.py); security 'none' only when the config lists
it, with a warning. docs/line-io.md.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from asyncua import Node, Server, ua
from asyncua.common.connection import TransportLimits
from asyncua.common.methods import uamethod
from asyncua.server.address_space import NodeData

from edge_runtime.config.line_protocols import OpcUaConfig
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import SupervisedThread
from edge_runtime.lineio.opcua.asyncua_logs import tame_asyncua_logs
from edge_runtime.lineio.opcua.guard import Door, GuardedServer, only_good_writes, secure
from edge_runtime.lineio.opcua.pki import ConfiguredUsers, TrustList
from edge_runtime.lineio.signals import LineOutcome, LineRefused, Signals
from edge_runtime.lineio.station import Station

log = logging.getLogger(__name__)
NAMESPACE = "urn:edge-runtime:lineio"
MAX_PENDING = 1024
# Signals field -> (browse name, variant type)
_OUTPUTS: dict[str, tuple[str, ua.VariantType]] = {
    "trigger_enable": ("TriggerEnable", ua.VariantType.Boolean), "ready": ("Ready", ua.VariantType.Boolean),
    "trigger_ack": ("TriggerAck", ua.VariantType.Boolean), "busy": ("Busy", ua.VariantType.Boolean),
    "acquisition_done": ("AcquisitionDone", ua.VariantType.Boolean),
    "result_valid": ("ResultValid", ua.VariantType.Boolean),
    "inspection_seq": ("InspectionSeq", ua.VariantType.UInt32), "part_id": ("PartId", ua.VariantType.String),
    "recipe": ("RecipeId", ua.VariantType.String), "result": ("Result", ua.VariantType.Int32),
    "defect_code": ("DefectCode", ua.VariantType.Int32), "heartbeat": ("Heartbeat", ua.VariantType.UInt32),
    "fault": ("Fault", ua.VariantType.Boolean), "buffer_count": ("BufferCount", ua.VariantType.UInt32),
    "overrun": ("Overrun", ua.VariantType.Boolean)}
# The order a snapshot's changes are written in (the rest: 1); see _publish.
_WRITE_ORDER = {"inspection_seq": 2, "trigger_ack": 3, "result_valid": 4}
# Refusals as OPC UA status codes (the reason is in LastRefusal too).
_REFUSAL_CODES = {"not_ready": ua.StatusCodes.BadInvalidState, "disabled": ua.StatusCodes.BadInvalidState,
                  "busy": ua.StatusCodes.BadResourceUnavailable, "overrun": ua.StatusCodes.BadResourceUnavailable,
                  "bad_part_id": ua.StatusCodes.BadInvalidArgument, "bad_recipe": ua.StatusCodes.BadInvalidArgument}


class _StationNodes:
    """One station's nodes and what was last written to them."""

    def __init__(self, station: Station) -> None:
        self.station = station
        self.outputs: dict[str, Node] = {}
        self.inputs: dict[str, Node] = {}
        self.refusal: Node | None = None
        self.refusal_text = ""  # what LastRefusal shows
        self.events: Any = None
        self.shown: dict[str, Any] = {}
        self.valid_head: int | None = None  # the job whose ResultReady was sent
        self.unwatch: Any = None


class OpcUaServer:
    """The stations served over OPC UA, in a supervised thread with its own event loop."""

    name = "opcua"

    def __init__(self, stations: list[Station], cfg: OpcUaConfig, pki_dir: Path, application_uri: str) -> None:
        self.cfg = cfg
        self.stations = stations
        self.pki_dir = pki_dir
        self.application_uri = application_uri
        self.trust = TrustList(pki_dir)
        self.users = ConfiguredUsers(cfg.users, cfg.anonymous)
        self.door = Door(cfg, self.trust)
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._nodes: list[_StationNodes] = []
        self._inputs: set[ua.NodeId] = set()  # the nodes the line writes
        # Snapshots not yet written, in order: every edge reaches the line (AcquisitionDone low->high for
        # each job), not only the newest state. Bounded: a stalled loop drops the oldest (counted).
        self._pending: deque[tuple[int, Signals]] = deque(maxlen=MAX_PENDING)
        self._pending_lock = threading.Lock()
        self.listening = False
        # Set by _publish (on the loop thread) just before it shows a snapshot on an input node
        # (TriggerEnable is both): the setter, called synchronously by that write before anything
        # awaits, takes it down and does not pass the echo back to the station.
        self._echoing = False
        self.counters = {"calls": 0, "refused_calls": 0, "events": 0, "writes": 0, "dropped_snapshots": 0}
        self._thread = SupervisedThread("lineio-opcua", self._run, self._stop, log)

    # ---- service --------------------------------------------------------------------------------

    def start(self) -> None:
        tame_asyncua_logs()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop just closed
                pass
        self._thread.join(5.0)

    def health(self) -> SinkHealth:
        return SinkHealth(ok=self.listening, detail="" if self.listening else "OPC UA server not listening",
                          counters={**self.counters,  # refused_certificates, refused_logins, ...: the door's
                                    **{f"refused_{kind}": n for kind, n in self.door.refusals.counts.items()}})

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def endpoint(self) -> str:
        return f"opc.tcp://{self.cfg.host}:{self.cfg.port}/edge-runtime/"

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        server = await self._build()
        try:
            async with server:
                self.listening = True
                log.info("opcua: serving %d station(s) on %s (security: %s)", len(self.stations), self.endpoint(),
                         ", ".join(self.cfg.security))
                while not self._stop.is_set():
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                    except TimeoutError:
                        pass
                    self._wake.clear()
                    await self._flush()
        finally:
            self.listening = False
            for nodes in self._nodes:
                if nodes.unwatch is not None:
                    nodes.unwatch()
            self._nodes = []

    # ---- address space ----------------------------------------------------------------------------

    async def _build(self) -> Server:
        server = GuardedServer(self.door, user_manager=self.users)
        await server.init()
        # Bounds for a line's few clients instead of asyncua's (1000 connections, 1000 subscriptions,
        # 10000-value queues): what one misbehaving client can make the device hold.
        iserver = server.iserver
        iserver.max_connections = self.cfg.max_clients
        iserver.max_subscriptions = 8 * self.cfg.max_clients
        iserver.max_monitored_item_queue_size = 1000
        iserver.max_pending_messages_per_connection = 100
        self._inputs.clear()
        only_good_writes(server, self._inputs)  # a write with a Bad status must not reach the station
        server.set_endpoint(self.endpoint())
        # A PLC's messages are small: 1 MiB, not asyncua's 100 MB, bounds what one client can make us hold.
        server.limits = TransportLimits(max_recv_buffer=65535, max_send_buffer=65535, max_chunk_count=16,
                                        max_message_size=1 << 20)
        server.set_server_name("edge-runtime line I/O")
        await server.set_application_uri(self.application_uri)
        await secure(server, self.cfg, self.pki_dir, self.application_uri, self.trust)
        idx = await server.register_namespace(NAMESPACE)
        etype = await _result_ready_type(server, idx)
        root = await server.nodes.objects.add_object(f"ns={idx};s=EdgeRuntime",
                                                     f"{idx}:EdgeRuntime")
        self._nodes = []
        for i, station in enumerate(self.stations):
            self._nodes.append(await self._add_station(server, idx, root, etype, i, station))
        self._server = server
        return server

    async def _add_station(self, server: Server, idx: int, root: Node, etype: Any, i: int,
                           station: Station) -> _StationNodes:
        nodes = _StationNodes(station)
        base = f"{station.name}."
        obj = await root.add_object(f"ns={idx};s={station.name}", f"{idx}:{station.name}")
        snap = station.signals()
        for name, (browse, vtype) in _OUTPUTS.items():
            if name == "trigger_enable":
                continue  # an input (below) that also shows the current state
            nodes.outputs[name] = await obj.add_variable(f"ns={idx};s={base}{browse}", f"{idx}:{browse}",
                                                         _value(snap, name), vtype)
        for browse, vtype, initial in (("TriggerEnable", ua.VariantType.Boolean, snap.trigger_enable),
                                       ("Trigger", ua.VariantType.Boolean, False),
                                       ("PartIdIn", ua.VariantType.String, ""),
                                       ("RecipeIdIn", ua.VariantType.String, ""),
                                       ("ResultAckIn", ua.VariantType.Boolean, False)):
            var = await obj.add_variable(f"ns={idx};s={base}{browse}", f"{idx}:{browse}", initial, vtype)
            await var.set_writable()
            nodes.inputs[browse] = var
            self._inputs.add(var.nodeid)
            server.set_attribute_value_setter(var.nodeid, self._setter(nodes, browse))
        nodes.outputs["trigger_enable"] = nodes.inputs["TriggerEnable"]
        nodes.refusal = await obj.add_variable(f"ns={idx};s={base}LastRefusal",
                                               f"{idx}:LastRefusal", "", ua.VariantType.String)

        @uamethod
        def start_single_job(parent: ua.NodeId, part_id: str, recipe_id: str) -> Any:
            return self._start_job(nodes, part_id, recipe_id)

        @uamethod
        def result_ack(parent: ua.NodeId, job_id: int) -> Any:
            self.counters["calls"] += 1
            return bool(station.ack_result(int(job_id) if job_id else None))

        await _add_method(obj, idx, f"{base}StartSingleJob", start_single_job,
                          [("PartId", ua.VariantType.String), ("RecipeId", ua.VariantType.String)],
                          [("JobId", ua.VariantType.UInt32)])
        await _add_method(obj, idx, f"{base}ResultAck", result_ack, [("JobId", ua.VariantType.UInt32)],
                          [("Cleared", ua.VariantType.Boolean)])
        nodes.events = await server.get_event_generator(etype, obj.nodeid)
        nodes.shown = {name: _value(snap, name) for name in _OUTPUTS}
        nodes.unwatch = station.watch(lambda s, i=i: self._signals_changed(i, s))  # type: ignore[misc]
        return nodes

    # ---- the line's writes and calls (on the server's loop) ------------------------------------

    def _start_job(self, nodes: _StationNodes, part_id: Any, recipe_id: Any) -> Any:
        self.counters["calls"] += 1
        try:
            if not isinstance(part_id, str) or not isinstance(recipe_id, str | None):
                raise LineRefused("bad_part_id", "PartId and RecipeId must be strings")
            seq = nodes.station.trigger(part_id, recipe_id)
        except LineRefused as exc:
            self._refused(nodes, exc)
            return ua.StatusCode(ua.UInt32(_REFUSAL_CODES.get(exc.reason, ua.StatusCodes.BadInvalidState)))
        self._show_refusal(nodes, "")  # accepted: LastRefusal is about the last trigger
        nodes.station.release_trigger()  # a method call is its own edge: TriggerAck pulses
        return ua.Variant(seq, ua.VariantType.UInt32)

    def _refused(self, nodes: _StationNodes, exc: LineRefused) -> None:
        self.counters["refused_calls"] += 1
        self._show_refusal(nodes, f"{exc.reason}: {exc}"[:200])

    def _not_stored(self, nodes: _StationNodes, stored: Future[int]) -> None:
        exc = None if stored.cancelled() else stored.exception()
        if isinstance(exc, LineRefused):  # the trigger could not be stored: refused after all
            self._refused(nodes, exc)

    def _show_refusal(self, nodes: _StationNodes, text: str) -> None:
        """LastRefusal, written on the server's loop in call order (methods run in executor threads)."""
        with self._pending_lock:
            if nodes.refusal is None or self._loop is None or nodes.refusal_text == text:
                return
            nodes.refusal_text = text
            write = nodes.refusal.write_value(ua.Variant(text, ua.VariantType.String))
            asyncio.run_coroutine_threadsafe(write, self._loop)

    def _setter(self, nodes: _StationNodes, browse: str) -> Any:
        def setter(node: NodeData, attr: ua.AttributeIds, value: ua.DataValue) -> None:
            old = node.attributes[attr].value
            node.attributes[attr].value = value
            if self._echoing:
                self._echoing = False
                return  # our own snapshot shown on an input node (TriggerEnable), not the line's write
            new = value.Value.Value if value.Value is not None else None
            was = old.Value.Value if old is not None and old.Value is not None else None
            station = nodes.station
            if browse == "TriggerEnable":
                station.set_trigger_enable(bool(new))
            elif browse == "Trigger":
                if new and not was:
                    part = self._read_text(nodes.inputs["PartIdIn"])
                    recipe = self._read_text(nodes.inputs["RecipeIdIn"])
                    try:  # on the server's loop: TriggerAck shows once the trigger is durable
                        stored = station.request_trigger(part, recipe)
                    except LineRefused as exc:
                        self._refused(nodes, exc)
                    else:
                        self._show_refusal(nodes, "")
                        stored.add_done_callback(lambda f: self._not_stored(nodes, f))
                elif not new and was:
                    station.release_trigger()
            elif browse == "ResultAckIn" and new and not was:
                self.counters["calls"] += 1
                station.request_ack()
        return setter

    def _read_text(self, node: Node) -> str:
        value = self._server.read_attribute_value(node.nodeid).Value
        text = value.Value if value is not None else ""
        return text if isinstance(text, str) else ""

    # ---- signals out ------------------------------------------------------------------------------

    def _signals_changed(self, i: int, signals: Signals) -> None:
        """A station's watcher (any thread): keep the newest snapshot, wake the loop; never blocks."""
        with self._pending_lock:
            if len(self._pending) == MAX_PENDING:
                self.counters["dropped_snapshots"] += 1
            self._pending.append((i, signals))
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop is closing
                pass

    async def _flush(self) -> None:
        with self._pending_lock:
            pending = list(self._pending)
            self._pending.clear()
        for i, signals in pending:
            if i < len(self._nodes):
                await self._publish(self._nodes[i], signals)

    async def _publish(self, nodes: _StationNodes, signals: Signals) -> None:
        # A client publishing at once (publishing interval 0) is sent each change as it is written, so the
        # order matters: ResultValid goes low first (also for the moment the FIFO head moves on to the next
        # result), then the job's values, its InspectionSeq, the TriggerAck of that InspectionSeq, and
        # ResultValid rises last: no moment shows a valid job with another job's Result or PartId.
        if nodes.shown.get("result_valid") and (not signals.result_valid
                                                 or nodes.shown.get("inspection_seq") != signals.inspection_seq):
            await self._write(nodes, "result_valid", False)
        for name in sorted(_OUTPUTS, key=lambda n: _WRITE_ORDER.get(n, 1)):
            value = _value(signals, name)
            if nodes.shown.get(name) != value:
                await self._write(nodes, name, value)
        head = signals.inspection_seq if signals.result_valid else None
        if head is not None and head != nodes.valid_head:
            event = nodes.events.event
            event.JobId = ua.Variant(signals.inspection_seq, ua.VariantType.UInt32)
            event.PartId, event.RecipeId, event.Station = signals.part_id, signals.recipe, nodes.station.name
            event.Result = ua.Variant(int(signals.result), ua.VariantType.Int32)
            event.DefectCode = ua.Variant(signals.defect_code, ua.VariantType.Int32)
            event.Severity = 500 if signals.result != LineOutcome.OK else 100
            await nodes.events.trigger(message=f"job {signals.inspection_seq} {signals.result.name}")
            self.counters["events"] += 1
        nodes.valid_head = head

    async def _write(self, nodes: _StationNodes, name: str, value: Any) -> None:
        nodes.shown[name] = value
        # Only for a node with our setter: a flag left up across the write's awaits (its
        # data-change callbacks) would swallow a client's write made meanwhile.
        self._echoing = nodes.outputs[name] in nodes.inputs.values()
        try:
            await self._server.write_attribute_value(
                nodes.outputs[name].nodeid, ua.DataValue(ua.Variant(value, _OUTPUTS[name][1])))
        finally:
            self._echoing = False
        self.counters["writes"] += 1

    _server: Any = None


# Every node of our namespace has a string id made of names (ns=<i>;s=<station>.<Name>, the event type
# and its fields by name): a client that reconnects after a restart, even of a config with more
# stations, finds each node under the id it subscribed to. asyncua's helpers number the nodes they
# create (event type fields, method arguments) in creation order; these two do not.
_EVENT_FIELDS = [("JobId", ua.VariantType.UInt32), ("PartId", ua.VariantType.String),
                 ("RecipeId", ua.VariantType.String), ("Result", ua.VariantType.Int32),
                 ("DefectCode", ua.VariantType.Int32), ("Station", ua.VariantType.String)]


async def _result_ready_type(server: Server, idx: int) -> Node:
    etype = await server.nodes.base_event_type.add_object_type(
        f"ns={idx};s=ResultReadyEventType", ua.QualifiedName("ResultReadyEventType", idx))
    for name, vtype in _EVENT_FIELDS:
        await etype.add_property(f"ns={idx};s=ResultReadyEventType.{name}", ua.QualifiedName(name, idx),
                                 ua.get_default_value(vtype), varianttype=vtype)
    return etype


async def _add_method(obj: Node, idx: int, name: str, func: Any, inputs: list[tuple[str, ua.VariantType]],
                      outputs: list[tuple[str, ua.VariantType]]) -> None:
    method = await obj.add_method(f"ns={idx};s={name}", ua.QualifiedName(name.rsplit(".", 1)[-1], idx), func, [], [])
    for prop, args in (("InputArguments", inputs), ("OutputArguments", outputs)):
        value = [ua.Argument(Name=arg, DataType=ua.NodeId(ua.Int32(vtype.value)), ValueRank=-1, ArrayDimensions=[],
                             Description=ua.LocalizedText(arg)) for arg, vtype in args]
        node = await method.add_property(f"ns={idx};s={name}.{prop}", ua.QualifiedName(prop, 0), value,
                                         varianttype=ua.VariantType.ExtensionObject, datatype=ua.ObjectIds.Argument)
        await node.set_modelling_rule(True)


def _value(signals: Signals, name: str) -> Any:
    value = getattr(signals, name)
    return int(value) if isinstance(value, LineOutcome) else value

"""Modbus TCP server for the line: each station's register map (modbus_map.py) on pymodbus 3.x.

Off by default. It listens on one configured interface, closes every connection from an address
outside the allow-list and past `max_clients` (a new one from an allowed address takes the place of
one silent for a second or more; connections are kept alive and closed after a minute without a
request: modbus_link.py), answers each connection's requests in order, and lets a client write only
the control registers:
any other address answers "illegal data address" (0x02) and a function code other than the holding
register reads and writes answers "illegal function" (0x01). Edges of the ControlWord's bits drive the
station: Trigger rising -> `trigger(part_id, recipe)`, falling -> `release_trigger()`, ResultAck
rising -> `ack_result()`, TriggerEnable -> `set_trigger_enable()`. The status registers are filled
from one `Signals` snapshot on every read, so a poll never sees a half-updated station.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from concurrent.futures import Future
from typing import Any

from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.simulator import DataType, SimData, SimDevice

from edge_runtime.config.line_protocols import ModbusConfig
from edge_runtime.core.sink import SinkHealth
from edge_runtime.core.supervise import RateLimitedLog, SupervisedThread
from edge_runtime.lineio import modbus_map as rm
from edge_runtime.lineio.modbus_link import EVICT_AFTER_S, IDLE_TIMEOUT_S, Link, sweep
from edge_runtime.lineio.signals import LineRefused
from edge_runtime.lineio.station import Station

WRITE_WAIT_S = 10.0  # a control write is answered after its trigger / ack is durable, or after this

log = logging.getLogger(__name__)

READS = frozenset({3, 4})        # read holding registers; input registers read the same block
WRITES = frozenset({6, 16, 23})  # write single, write multiple, read/write multiple
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class _Counters:
    def __init__(self) -> None:
        self.connections = 0
        self.refused_clients = 0
        self.writes = 0
        self.refused_writes = 0
        self.triggers = 0
        self.refused_triggers = 0
        self.acks = 0
        self.station_errors = 0
        self.evicted = 0
        self.idle_closed = 0
        self.bad_streams = 0


class _StationBlock:
    """One station's place in the register space and the last control state its edges are seen from."""

    def __init__(self, station: Station, base: int) -> None:
        self.station = station
        self.base = base
        self.last_refusal = 0


class _Server(ModbusTcpServer):
    def __init__(self, guard: ModbusServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = guard

    def callback_new_connection(self) -> ServerRequestHandler:
        link = Link(self, self.trace_packet, self.trace_pdu, self.trace_connect)
        link.guard = self.guard
        return link


class ModbusServer:
    """The stations' register map over Modbus TCP, served from its own supervised thread and loop."""

    name = "modbus"

    def __init__(self, stations: list[Station], cfg: ModbusConfig, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 evict_after_s: float = EVICT_AFTER_S) -> None:
        self.cfg = cfg
        self.idle_timeout_s = idle_timeout_s
        self.evict_after_s = evict_after_s
        self.blocks = [_StationBlock(s, i * cfg.stride) for i, s in enumerate(stations)]
        self.allow: list[Network] = [ipaddress.ip_network(a, strict=False) for a in cfg.allow]
        self.counters = _Counters()
        self.refusal_log = RateLimitedLog(log)
        self.eviction_log = RateLimitedLog(log)
        self.port: int | None = None  # the bound port once listening (cfg.port may be 0)
        self.listening = threading.Event()
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: _Server | None = None
        self._thread = SupervisedThread("lineio-modbus", self._run, self._stop, log)

    # ---- service -------------------------------------------------------------------------------

    def start(self) -> None:
        log.info("modbus: serving %d station(s) on %s:%d, clients from %s", len(self.blocks), self.cfg.host,
                 self.cfg.port, ", ".join(self.cfg.allow))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        loop, server = self._loop, self._server
        if loop is not None and server is not None and loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(server.shutdown(), loop).result(timeout=5)
            except Exception:  # the loop may be closing on its own; the thread ends either way
                log.debug("modbus: shutdown", exc_info=True)
        self._thread.join(5)

    def threads(self) -> list[SupervisedThread]:
        return [self._thread]

    def health(self) -> SinkHealth:
        c = self.counters
        ok = self.listening.is_set() and self._thread.is_alive()
        return SinkHealth(ok=ok, detail="" if ok else (self.last_error or "not listening"),
                          counters={"connections": c.connections, "refused_clients": c.refused_clients,
                                    "writes": c.writes, "refused_writes": c.refused_writes,
                                    "triggers": c.triggers, "refused_triggers": c.refused_triggers,
                                    "acks": c.acks, "station_errors": c.station_errors, "evicted": c.evicted,
                                    "idle_closed": c.idle_closed, "bad_streams": c.bad_streams,
                                    "restarts": self._thread.restarts})

    def refuse_reason(self, host: str) -> str:
        """Why a new connection from `host` is closed whatever room there is ('' when it may stay)."""
        try:
            addr = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return "unknown peer address"
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if not any(addr in net for net in self.allow):
            return "not on the allow-list"
        return ""

    # ---- the server thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.listening.clear()

    async def _serve(self) -> None:
        if self._stop.is_set():
            return
        simdata = []
        for b in self.blocks:
            # The ControlWord starts as the station is (TriggerEnable on at start): a PLC's first write with
            # TriggerEnable off is then an edge that turns triggers off, not a bit that "did not change".
            enabled = rm.TRIGGER_ENABLE if b.station.signals().trigger_enable else 0
            simdata.append(SimData(b.base + rm.CONTROL, values=[enabled] + [0] * (rm.CONTROL_END - 1),
                                   datatype=DataType.REGISTERS))
            simdata.append(SimData(b.base + rm.STATUS, count=rm.STATUS_END - rm.STATUS,
                                   datatype=DataType.REGISTERS, readonly=True))
        device = SimDevice(0, simdata=simdata, action=self._action)
        self._loop = asyncio.get_running_loop()
        self._server = server = _Server(self, context=device, address=(self.cfg.host, self.cfg.port))
        await server.serve_forever(background=True)
        listener = server.transport
        sockets = getattr(listener, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self.cfg.port
        self.listening.set()
        self.last_error = None
        log.info("modbus: listening on %s:%d", self.cfg.host, self.port)
        try:
            while not self._stop.is_set() and not server.serving.done():
                await asyncio.sleep(0.2)
                sweep(list(server.active_connections.values()), self.idle_timeout_s)
        finally:
            self.listening.clear()
            await server.shutdown()

    # ---- requests (the server's event loop) --------------------------------------------------------

    async def _action(self, function_code: int, start_address: int, address: int, count: int,
                      registers: list[int], values: list[int] | list[bool] | None) -> ExcCodes | None:
        """pymodbus calls this after its address checks and before a write lands in `registers`."""
        if values is None:  # a read, or the read-back of a write (FC6 and FC23 answer with the registers)
            if function_code not in READS | WRITES:
                return ExcCodes.ILLEGAL_FUNCTION
            self._refresh(start_address, address, count, registers)
            return None
        if function_code not in WRITES:
            self.counters.refused_writes += 1
            return ExcCodes.ILLEGAL_FUNCTION
        block = self._block_of(address)
        if block is None or address + count > block.base + rm.CONTROL_END:
            self.counters.refused_writes += 1  # unreachable through pymodbus's checks; kept as the last word
            return ExcCodes.ILLEGAL_ADDRESS
        self.counters.writes += 1
        first = block.base - start_address
        before = registers[first:first + rm.CONTROL_END]
        after = list(before)
        lo = address - block.base
        after[lo:lo + count] = [int(v) for v in values]
        writing = self._apply(block, rm.Control.decode(before), rm.Control.decode(after))
        if writing:
            # Answered once the trigger / ack is durable and shown, as a PLC polling right after its
            # write expects (TriggerAck up, the acknowledged result gone); other clients' requests go on
            # meanwhile: only this request waits for the disk, not the loop.
            done, _ = await asyncio.wait([asyncio.wrap_future(f) for f in writing], timeout=WRITE_WAIT_S)
            for task in done:
                if isinstance(task.exception(), LineRefused):
                    block.last_refusal = rm.REFUSAL_CODES.get("not_ready", rm.REFUSAL_OTHER)
        return None

    def _block_of(self, address: int) -> _StationBlock | None:
        for b in self.blocks:
            if b.base <= address < b.base + self.cfg.stride:
                return b
        return None

    def _refresh(self, start_address: int, address: int, count: int, registers: list[int]) -> None:
        """Write the current status of every station whose status registers the read covers."""
        for b in self.blocks:
            lo, hi = b.base + rm.STATUS, b.base + rm.STATUS_END
            if address < hi and address + count > lo:
                try:
                    words = rm.encode_status(b.station.signals(), b.last_refusal)
                except Exception:  # noqa: BLE001 - a failing station reads as faulted, the server goes on
                    self.counters.station_errors += 1
                    self.refusal_log.log(logging.ERROR, "modbus: station %s failed to report", b.station.name,
                                         exc_info=True)
                    words = [rm.FAULT] + [0] * (rm.STATUS_END - rm.STATUS - 1)
                registers[lo - start_address:hi - start_address] = words

    def _apply(self, block: _StationBlock, old: rm.Control, new: rm.Control) -> list[Future[Any]]:
        """Turn the ControlWord's edges into station calls (enable first, then trigger, then ack);
        returns the writes still on their way to the disk."""
        st = block.station
        writing: list[Future[Any]] = []
        try:
            if new.trigger_enable != old.trigger_enable:
                st.set_trigger_enable(new.trigger_enable)
            if new.trigger and not old.trigger:
                self.counters.triggers += 1
                try:
                    writing.append(st.request_trigger(new.part_id, new.recipe or None))
                    block.last_refusal = 0
                except LineRefused as exc:
                    self.counters.refused_triggers += 1
                    block.last_refusal = rm.REFUSAL_CODES.get(exc.reason, rm.REFUSAL_OTHER)
            elif old.trigger and not new.trigger:
                st.release_trigger()
            if new.result_ack and not old.result_ack:
                self.counters.acks += 1
                acking = st.request_ack()
                if acking is not None:
                    writing.append(acking)
        except Exception:  # noqa: BLE001 - the write is answered; the station's fault shows in its status
            self.counters.station_errors += 1
            self.refusal_log.log(logging.ERROR, "modbus: station %s failed a control write", st.name, exc_info=True)
        return writing

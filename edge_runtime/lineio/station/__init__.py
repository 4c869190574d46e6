"""The station handshake every line protocol shares: trigger in, AcquisitionDone, OK/NOK out, ack.

One `Station` per configured station. A protocol adapter (OPC UA, Modbus, Sparkplug, GPIO) turns the
line's writes into `trigger` / `release_trigger` / `ack_result` / `set_trigger_enable` and publishes
what `watch` reports. The station never times an ejector: it reports results in trigger order through
a FIFO that only the line's ResultAck clears, and the PLC does the reject timing.

Durability: a trigger is written to the job store before it is acknowledged, a decided result and an
ack likewise, so after a kill -9 the FIFO comes back as it was (a job cut off before its verdict
becomes ERROR with defect code 902) and numbering continues: no part is reported twice. The writes
happen outside the station's lock (the job store group-commits them on its own thread): a change is
reserved under the lock, written, and shown to the line from the write's callback. So a slow disk
delays only the change being written, never a read of the signals, another station, or the delivery
thread that brings verdicts (`notify` returns before the outcome is on disk).
"""

from edge_runtime.lineio.station.handshake import Station

__all__ = ["Station"]

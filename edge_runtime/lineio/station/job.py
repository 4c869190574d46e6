"""One part's job in a station's FIFO, from its trigger to its ack."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edge_runtime.lineio.signals import LineOutcome


@dataclass
class Job:
    seq: int
    part_id: str
    recipe: str
    deadline: float  # monotonic: the verdict must be decided by then
    triggered: float = field(default_factory=time.monotonic)
    acquired: bool = False
    result: LineOutcome = LineOutcome.NONE
    defect_code: int = 0
    result_id: str | None = None
    deciding: bool = False  # its outcome is being written (shown once durable)
    acking: bool = False  # its ResultAck is being written (it leaves the FIFO once durable)

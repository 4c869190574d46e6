"""The Modbus TCP register map of one station: what the PLC writes, what it reads, and the codecs.

Every station owns a block of holding registers (`stride` apart, 100 by default: station 0 at 0,
station 1 at 100, ...). Offsets inside the block:

| offset | registers | name | access | meaning |
| --- | --- | --- | --- | --- |
| 0 | 1 | ControlWord | write | bit 0 TriggerEnable (1 at start when enabled), bit 1 Trigger, bit 2 ResultAck |
| 1 | 16 | PartId | write | 32 ASCII characters, two per register (first character in the high byte), NUL-padded |
| 17 | 8 | RecipeId | write | 16 ASCII characters, the same packing; empty: the station's default recipe |
| 50 | 1 | StatusWord | read | bits 0-7: Ready, TriggerAck, Busy, AcqDone, ResultValid, Fault, Overrun, Enabled |
| 51 | 2 | InspectionSeq | read | unsigned 32-bit, high word first |
| 53 | 1 | Result | read | 0 none, 1 OK, 2 NOK, 3 error (counts as NOK) |
| 54 | 1 | DefectCode | read | 0 with OK; 900 deadline passed, 901 no frame |
| 55 | 1 | Heartbeat | read | increments every heartbeat_ms (wraps at 65535) |
| 56 | 1 | BufferCount | read | results waiting for ResultAck |
| 57 | 1 | LastRefusal | read | why the last trigger was refused (REFUSAL_CODES), 0 after an accepted one |
| 58 | 16 | PartId (echo) | read | the part id of the result shown |

Everything else in the block, and every address past the last station, answers "illegal data
address"; a write to a status register too. Coils, discrete inputs and input registers are not used
(the function codes answer "illegal function").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge_runtime.lineio.signals import Signals

CONTROL = 0
PART_ID = 1
PART_ID_REGS = 16
RECIPE_ID = 17
RECIPE_ID_REGS = 8
CONTROL_END = RECIPE_ID + RECIPE_ID_REGS  # first offset after the writable registers
STATUS = 50
SEQ = 51
RESULT = 53
DEFECT_CODE = 54
HEARTBEAT = 55
BUFFER_COUNT = 56
LAST_REFUSAL = 57
PART_ID_ECHO = 58
STATUS_END = PART_ID_ECHO + PART_ID_REGS

# ControlWord bits
TRIGGER_ENABLE = 1 << 0
TRIGGER = 1 << 1
RESULT_ACK = 1 << 2

# StatusWord bits
READY = 1 << 0
TRIGGER_ACK = 1 << 1
BUSY = 1 << 2
ACQUISITION_DONE = 1 << 3
RESULT_VALID = 1 << 4
FAULT = 1 << 5
OVERRUN = 1 << 6
TRIGGER_ENABLED = 1 << 7

REFUSAL_CODES = {"not_ready": 1, "disabled": 2, "busy": 3, "overrun": 4, "bad_part_id": 5, "bad_recipe": 6}
REFUSAL_OTHER = 99  # a refusal reason this map does not know yet


def encode_text(text: str, registers: int) -> list[int]:
    """ASCII text as big-endian character pairs, NUL-padded to `registers` registers."""
    raw = text.encode("ascii", "replace")[: registers * 2].ljust(registers * 2, b"\0")
    return [(raw[i] << 8) | raw[i + 1] for i in range(0, len(raw), 2)]


def decode_text(regs: Sequence[int]) -> str:
    """The inverse of `encode_text`; stops at the first NUL. Bytes outside printable ASCII are kept
    as they are so the station refuses them (bad_part_id) instead of this layer hiding them."""
    raw = b"".join(bytes(((r >> 8) & 0xFF, r & 0xFF)) for r in regs)
    return raw.split(b"\0", 1)[0].decode("latin-1")


@dataclass(frozen=True)
class Control:
    """The PLC's writable registers of one station, decoded."""

    trigger_enable: bool
    trigger: bool
    result_ack: bool
    part_id: str
    recipe: str

    @classmethod
    def decode(cls, block: list[int]) -> Control:
        """From the first CONTROL_END registers of a station block."""
        word = block[CONTROL]
        return cls(trigger_enable=bool(word & TRIGGER_ENABLE), trigger=bool(word & TRIGGER),
                   result_ack=bool(word & RESULT_ACK),
                   part_id=decode_text(block[PART_ID:PART_ID + PART_ID_REGS]),
                   recipe=decode_text(block[RECIPE_ID:RECIPE_ID + RECIPE_ID_REGS]))


def encode_status(s: Signals, last_refusal: int) -> list[int]:
    """The read-only registers STATUS..STATUS_END from one `Signals` snapshot."""
    word = 0
    for flag, bit in ((s.ready, READY), (s.trigger_ack, TRIGGER_ACK), (s.busy, BUSY),
                      (s.acquisition_done, ACQUISITION_DONE), (s.result_valid, RESULT_VALID),
                      (s.fault, FAULT), (s.overrun, OVERRUN), (s.trigger_enable, TRIGGER_ENABLED)):
        if flag:
            word |= bit
    seq = s.inspection_seq & 0xFFFFFFFF
    return [word, seq >> 16, seq & 0xFFFF, int(s.result) & 0xFFFF, max(0, min(s.defect_code, 0xFFFF)),
            s.heartbeat & 0xFFFF, max(0, min(s.buffer_count, 0xFFFF)), last_refusal,
            *encode_text(s.part_id, PART_ID_REGS)]

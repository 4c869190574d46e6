"""What /proc/cpuinfo says about the CPU, read the same way on x86 and on ARM.

x86 kernels write a `model name` and `flags` per logical CPU. aarch64 kernels write `Features` and the
core's `CPU implementer` / `CPU part` numbers, and usually no `model name` (a Jetson Orin has none; a
Xavier's says only "ARMv8 Processor rev 0 (v8l)"): the core's name comes from its part number. A board
may mix cores (TX2: Denver 2 + Cortex-A57); each kind is counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# (implementer, part) -> core: Arm's cores on Jetsons and common aarch64 boards and servers, NVIDIA's own.
ARM_CORES = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE", (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510",
    (0x41, 0xD47): "Cortex-A710", (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4B): "Cortex-A78C", (0x41, 0xD4F): "Neoverse-V2",
    (0x4E, 0x003): "NVIDIA Denver 2", (0x4E, 0x004): "NVIDIA Carmel",
}
# A `model name` that names no core (older ARM kernels write it).
_GENERIC_ARM_NAME = re.compile(r"^ARMv\d+ Processor")


@dataclass(frozen=True)
class CpuInfo:
    """The logical CPUs listed, their kinds in order of appearance, and the features all of them have."""

    kinds: tuple[tuple[str, int], ...]
    features: frozenset[str]

    @property
    def cores(self) -> int:
        return sum(n for _, n in self.kinds)

    def describe(self) -> str:
        return " + ".join(f"{n}x {name}" for name, n in self.kinds)


def _core_name(block: dict[str, str]) -> str:
    model = block.get("model name", "")
    if model and not _GENERIC_ARM_NAME.match(model):
        return re.sub(r"\s+", " ", model)
    try:
        key = (int(block["CPU implementer"], 16), int(block["CPU part"], 16))
    except (KeyError, ValueError):
        return model or "unknown CPU"
    return ARM_CORES.get(key, f"ARM core {key[0]:#x}/{key[1]:#05x}")


def parse_cpuinfo(text: str) -> CpuInfo | None:
    """None when the text lists no processor (a container or emulator may show something else)."""
    blocks = []
    for chunk in re.split(r"\n\s*\n", text):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" in fields and fields["processor"].isdigit():
            blocks.append(fields)
    if not blocks:
        return None
    counts: dict[str, int] = {}
    for block in blocks:
        name = _core_name(block)
        counts[name] = counts.get(name, 0) + 1
    features = frozenset.intersection(*(frozenset((b.get("flags") or b.get("Features") or "").split())
                                        for b in blocks))
    return CpuInfo(tuple(counts.items()), features)


def read_cpuinfo(root: Path = Path("/")) -> CpuInfo | None:
    """The machine's CPU (`root` lets tests describe another machine), or None when unreadable."""
    try:
        return parse_cpuinfo((root / "proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return None

"""A batch with M-RoPE's four positions per embedding switches between llama_batch_init's own position
array and a larger one it owns; freeing it must hand llama.cpp back its own array. Reading the struct's
`pos` field once and keeping that object kept a view of the field, which followed the switch: close()
then freed our array too, and every process that had decoded a large Qwen-VL image died at exit with
"double free or corruption" (seen on the H200 with a Qwen2.5-VL-3B-shape pair, then here)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

from edge_runtime.inference.llm.handles import Batch

SCRIPT = """
import gc
from edge_runtime.inference.llm.handles import Batch
b = Batch(8, 4, n_pos=4)
b.use_positions(list(range(32)))  # more positions than entries: the owned array
b.use_positions(list(range(8)))   # and back to llama.cpp's own
b.close()
del b
gc.collect()
print("exited cleanly", flush=True)
"""


def test_a_batch_that_used_its_owned_positions_frees_cleanly() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "exited cleanly" in proc.stdout, proc.stderr[-500:]


def test_small_position_lists_go_back_to_llama_cpps_own_array() -> None:
    with Batch(8, 4, n_pos=4) as b:
        own = ctypes.cast(b.struct.pos, ctypes.c_void_p).value
        b.use_positions(list(range(32)))
        assert ctypes.cast(b.struct.pos, ctypes.c_void_p).value != own
        b.use_positions([5, 6, 7])
        assert ctypes.cast(b.struct.pos, ctypes.c_void_p).value == own
        assert [b.struct.pos[i] for i in range(3)] == [5, 6, 7]

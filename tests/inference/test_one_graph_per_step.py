"""A batched step of several sequences runs as one llama.cpp graph. With a KV stream per sequence,
llama.cpp splits a batch whose rows are not consecutive sequence ids in increasing order, or have
different numbers of tokens, into one graph per run (llama_batch_allocr::split_equal), and on a GPU
each graph costs a whole step's kernel launches. Counted from llama.cpp's own batch log
(LLAMA_BATCH_DEBUG), in a process of its own: the variable is read when a context is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SERVE = """
import json, sys
from edge_runtime.config import Config
from edge_runtime.core.bundle.manifest import load_bundle
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.runtime import log_to
from edge_runtime.inference.llm.sequence import Prompt
from tests.support.images import synthetic_frames

graphs = [0]

def log(text):
    if b"added ubatch to split" in text:  # one per graph llama.cpp computes
        graphs[0] += 1

log_to(log)
cfg = Config(device_id="t")
ins = Inspector(load_bundle(sys.argv[1]), cfg.model.model_copy(update={"warmup": False}), "t")
prompts = [Prompt(*ins.sequence(ins.default_prompt, ins.encode(f)), ins.grammar, ins.max_tokens, tag=i)
           for i, f in enumerate(synthetic_frames(4, seed=41))]
feed, steps = ins.language.feed, []
decode = feed.decode

def counted(ctx, batch):
    before, rows = graphs[0], [batch.seq_id[i][0] for i in range(batch.n_tokens)]
    decode(ctx, batch)
    steps.append({"rows": rows, "graphs": graphs[0] - before, "image": not batch.token})

feed.decode = counted
ins.language.serve(prompts, lambda p, g: None, None)
print(json.dumps(steps))
"""


def test_a_step_of_several_sequences_runs_as_one_graph(demo_dir: Path) -> None:
    env = {**os.environ, "LLAMA_BATCH_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-c", _SERVE, str(demo_dir)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    batched = [s for s in steps if not s["image"] and len(set(s["rows"])) > 1]
    assert len(batched) > 10  # the four sequences decoded side by side
    # Fast-forward gave some rows several forced tokens; rows still go in slot order, as many tokens each.
    assert any(len(s["rows"]) > len(set(s["rows"])) for s in batched)
    for s in batched:
        slots = sorted(set(s["rows"]))
        assert s["rows"] == sorted(s["rows"])
        assert len({s["rows"].count(slot) for slot in slots}) == 1
        if slots == list(range(slots[0], slots[0] + len(slots))):  # consecutive: nothing forces a split
            assert s["graphs"] == 1, s

"""The worker's served batches: a chat that waits its turn behind a request that cannot join the
batch (a plain job) is still answered as a chat, after that request, in order. Real llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_runtime.core.device import ChatJob
from edge_runtime.core.governor_gate import OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.feed import Generation
from edge_runtime.inference.llm.grammar import schema_to_grammar
from edge_runtime.inference.worker import InspectionWorker
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import VerdictPipeline
from tests.support.images import synthetic_frames

YES_NO: dict[str, Any] = {"type": "object", "additionalProperties": False, "required": ["yes"],
                          "properties": {"yes": {"type": "boolean"}}}


def test_a_chat_behind_a_job_that_cannot_join_is_answered_as_a_chat_after_it(inspector: Inspector,
                                                                           tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    worker = InspectionWorker(InspectionQueue(8), lambda: inspector, journal,
                              VerdictPipeline(journal, lambda _camera: None).deliver, OpenGate(), lambda _camera: None)
    order: list[str] = []
    grammar = schema_to_grammar(YES_NO)
    first = InspectionRequest(None, "openai", journal=False,
                              chat=ChatJob("Is it round?", grammar=grammar, max_tokens=20))

    def plain_job(_inspector: Any) -> str:
        order.append("job")
        return "done"

    job = InspectionRequest(None, "openai", journal=False, job=plain_job)
    frame = synthetic_frames(1, seed=4)[0]
    behind = InspectionRequest(frame, "openai", journal=False, chat=ChatJob("Is it red?", image=frame, grammar=grammar,
                                                                          max_tokens=20))
    first.future.add_done_callback(lambda _f: order.append("first"))
    behind.future.add_done_callback(lambda _f: order.append("behind"))
    try:
        worker._serve([(first, None), (job, None), (behind, inspector.encode(frame))])
    finally:
        journal.close()
    assert job.future.result(timeout=0) == "done"
    answers = [first.future.result(timeout=0), behind.future.result(timeout=0)]
    assert all(isinstance(a, Generation) and json.loads(a.text) in ({"yes": True}, {"yes": False}) for a in answers)
    assert order == ["first", "job", "behind"]  # the job after the batch it could not join, the chat after it

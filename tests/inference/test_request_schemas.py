"""Per-request verdict schemas (a line station's recipe, issue 23): each request's verdict is
constrained by its own schema and validated against it, also when it shares a batch with frames
that use other schemas. Real llama.cpp and llguidance on the demo bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edge_runtime.core.batch import BatchJob
from edge_runtime.core.device import ChatJob
from edge_runtime.core.errors import InputError
from edge_runtime.core.governor_gate import OpenGate
from edge_runtime.core.inspection_queue import InspectionQueue, InspectionRequest
from edge_runtime.core.result import Result
from edge_runtime.inference.inspector import Inspector
from edge_runtime.inference.llm.grammar import schema_to_grammar
from edge_runtime.inference.schemas import SchemaRefused
from edge_runtime.inference.worker import InspectionWorker
from edge_runtime.verdicts.journal import Journal
from edge_runtime.verdicts.pipeline import VerdictPipeline
from tests.support.images import synthetic_frames

PASS_FAIL: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["ok", "zone"],
    "properties": {"ok": {"type": "boolean"}, "zone": {"type": "integer", "minimum": 1, "maximum": 4}},
}
GRADE: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["grade"],
    "properties": {"grade": {"type": "string", "enum": ["A", "B", "scrap"]}},
}


def _valid(verdict: dict[str, Any], schema: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(verdict)


def test_requests_with_different_schemas_in_one_batch_each_follow_their_own(inspector: Inspector) -> None:
    frames = synthetic_frames(3, seed=5)
    schemas: list[dict[str, Any] | None] = [PASS_FAIL, GRADE, None]
    jobs = [BatchJob(inspector.encode(f), f"cam{i}", seq=i, schema=s) for i, (f, s) in enumerate(zip(frames, schemas,
                                                                                                    strict=True))]
    outcomes = inspector.inspect_batch(jobs)
    assert all(isinstance(o, Result) for o in outcomes), outcomes
    results = [o for o in outcomes if isinstance(o, Result)]
    bundle = inspector.bundle.manifest.verdict_schema
    assert _valid(results[0].verdict, PASS_FAIL) and not _valid(results[0].verdict, GRADE)
    assert _valid(results[1].verdict, GRADE) and not _valid(results[1].verdict, PASS_FAIL)
    assert _valid(results[2].verdict, bundle) and not _valid(results[2].verdict, GRADE)
    assert [r.camera for r in results] == ["cam0", "cam1", "cam2"]


def test_one_request_with_its_own_schema_alone(inspector: Inspector) -> None:
    result = inspector.inspect(synthetic_frames(1, seed=9)[0], schema=GRADE)
    assert set(result.verdict) == {"grade"} and result.verdict["grade"] in ("A", "B", "scrap")
    assert json.loads(result.text) == result.verdict


def test_a_refused_schema_fails_its_request_alone_naming_the_field(inspector: Inspector) -> None:
    too_deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        too_deep = {"type": "object", "properties": {"x": too_deep}, "required": ["x"]}
    not_a_schema = {"type": "no-such-type"}
    frames = synthetic_frames(3, seed=2)
    jobs = [BatchJob(inspector.encode(f), "cam", schema=s) for f, s in zip(frames, [too_deep, GRADE, not_a_schema],
                                                                            strict=True)]
    outcomes = inspector.inspect_batch(jobs)
    assert isinstance(outcomes[0], SchemaRefused) and isinstance(outcomes[0], InputError)
    assert outcomes[0].field == "schema" and str(outcomes[0]).startswith("schema: ")
    assert isinstance(outcomes[1], Result) and _valid(outcomes[1].verdict, GRADE)
    assert isinstance(outcomes[2], SchemaRefused) and "not a valid JSON schema" in str(outcomes[2])
    with pytest.raises(SchemaRefused):
        inspector.inspect(frames[0], schema=not_a_schema)


def test_a_schema_is_compiled_once_and_kept_in_a_bounded_cache(inspector: Inspector) -> None:
    first = inspector.verdict_rules(dict(GRADE))
    again = inspector.verdict_rules(json.loads(json.dumps(GRADE)))  # an equal schema, another object
    assert again is first
    assert inspector.verdict_rules(None).validator is inspector.validator
    for n in range(40):
        inspector.verdict_rules({"type": "object", "properties": {f"f{n}": {"type": "boolean"}}, "required": [f"f{n}"]})
    assert len(inspector.schemas.kept) <= 32
    assert inspector.verdict_rules(GRADE) is not first  # evicted, then built again


def test_the_worker_holds_each_request_to_its_own_schema_beside_a_chat(inspector: Inspector, tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    pipeline = VerdictPipeline(journal, lambda _camera: None)
    queue = InspectionQueue(8)
    worker = InspectionWorker(queue, lambda: inspector, journal, pipeline.deliver, OpenGate(), lambda _camera: None)
    chat = queue.submit(InspectionRequest(None, "openai", journal=False, chat=ChatJob(
        "Describe the part as JSON.", grammar=schema_to_grammar(GRADE), max_tokens=40)))
    schemas: list[dict[str, Any] | None] = [PASS_FAIL, GRADE, None]
    futures = [queue.submit(InspectionRequest(frame, f"cam{i}", schema=schema))
               for i, (frame, schema) in enumerate(zip(synthetic_frames(3, seed=8), schemas, strict=True))]
    worker.start()
    try:
        results = [f.result(timeout=60) for f in futures]
        answer = chat.result(timeout=60)
    finally:
        worker.stop()
        journal.close()
    bundle = inspector.bundle.manifest.verdict_schema
    for result, schema in zip(results, schemas, strict=True):
        assert _valid(result.verdict, schema or bundle), (result.verdict, schema)
    assert not _valid(results[0].verdict, GRADE) and not _valid(results[1].verdict, PASS_FAIL)
    assert _valid(json.loads(answer.text), GRADE)

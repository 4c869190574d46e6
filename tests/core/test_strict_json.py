"""One strict reader for JSON from outside: what json.loads lets through and our journal or consumers
cannot keep is refused with the path of the field (the API, MQTT commands and offload all use it)."""

from __future__ import annotations

import pytest

from edge_runtime.core import strict_json
from edge_runtime.core.strict_json import StrictJsonError


@pytest.mark.parametrize("doc, field, words, malformed", [
    (b'{"a": 1, "a": 2}', "a", "more than once", False),
    (b'{"outer": {"k": 1, "k": 1}}', "outer.k", "more than once", False),
    (b'{"messages": [{"role": "user", "content": "a", "content": "b"}]}', "messages.0.content", "more than once",
     False),
    (b'{"x": NaN}', "", "NaN is not a JSON number", False),
    (b'{"x": -Infinity}', "", "-Infinity is not a JSON number", False),
    (b'{"x": 1e999}', "", "number out of range", False),
    (b'{"notes": ["ok", "bad \\ud800"]}', "notes.1", "lone surrogate", False),
    (b'{"\\udfff": 1}', "\\udfff", "lone surrogate", False),
    (b'"\\ud800"', "", "lone surrogate", False),
    (b"{not json", "", "not valid JSON", True),
    (b"\xff\xfe", "", "not valid JSON", True),
    (b"[" * 40 + b"]" * 40, "", "nested deeper than 32 levels", True),
    (b"[" * 100_000 + b"]" * 100_000, "", "nested deeper than 32 levels", True),
])
def test_refusals_name_the_field_and_say_why(doc: bytes, field: str, words: str, malformed: bool) -> None:
    with pytest.raises(StrictJsonError) as caught:
        strict_json.loads(doc, max_depth=32)
    assert caught.value.field == field and words in str(caught.value) and caught.value.malformed is malformed


def test_valid_documents_come_back_unchanged() -> None:
    doc = '{"defect": true, "score": 0.25, "notes": "é ✓", "tags": [1, [2, {"k": null}]]}'
    assert strict_json.loads(doc, max_depth=32) == {"defect": True, "score": 0.25, "notes": "é ✓",
                                                     "tags": [1, [2, {"k": None}]]}
    assert strict_json.json_depth({"a": [1, {"b": []}]}) == 4


def test_a_document_of_more_values_than_its_bound_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(StrictJsonError) as caught:
        strict_json.loads(b"[" + b",".join([b"{}"] * 1001) + b"]", max_depth=32, max_values=1000)
    assert "more than 1000 commas, arrays and objects" in str(caught.value) and caught.value.field == ""
    assert caught.value.malformed
    assert strict_json.loads(b"[" + b"1," * 998 + b"1]", max_depth=32, max_values=1000) == [1] * 999

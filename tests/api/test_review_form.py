"""The review form for any verdict schema, in a real Chromium against a running daemon whose bundle
(the demo's engines) answers with a nested schema: objects through $ref, an array of objects, an enum
array, a nullable string and a oneOf the form shows as JSON. The stored correction is read back over
REST. A second bundle has a hostile schema (markup in enum values and field names)."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import CameraConfig, Config, TriggerConfig
from edge_runtime.core.samples import write_sample_video
from tests.support.browser import chromium
from tests.support.waiting import wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

NESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {
        "point": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                  "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 640},
                                 "y": {"type": "integer", "minimum": 0, "maximum": 480}}},
        "finding": {"type": "object", "additionalProperties": False, "required": ["kind", "severity"],
                    "properties": {"kind": {"enum": ["scratch", "dent", "crack"]},
                                   "severity": {"type": "integer", "minimum": 1, "maximum": 5}}},
    },
    "properties": {
        "defect": {"type": "boolean"},
        "location": {"$ref": "#/$defs/point"},
        "findings": {"type": "array", "items": {"$ref": "#/$defs/finding"}, "maxItems": 2},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["scratch", "dent", "stain"]}, "maxItems": 3},
        # The form reads both nullable spellings (test_both_nullable_spellings_...); the type-list
        # one is bounded in the grammar too (tests/inference/test_schema_support.py).
        "operator_note": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]},
        "disposition": {"oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["rework"],
             "properties": {"rework": {"type": "boolean"}}},
            {"type": "object", "additionalProperties": False, "required": ["scrap"],
             "properties": {"scrap": {"enum": ["yes"]}}}]},
    },
    "required": ["defect", "location", "findings", "tags", "operator_note", "disposition"],
    "additionalProperties": False,
}
XSS = '<img src=x onerror="window.__xss=1">'
ODD_NAME = """part 'A' "B" <b>o'k</b>"""
HOSTILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"defect": {"type": "boolean"},
                   ODD_NAME: {"type": "string", "enum": [XSS, "fine"]},
                   "remark": {"type": "string", "maxLength": 200}},  # long enough for a <textarea>
    "required": ["defect", ODD_NAME, "remark"],
    "additionalProperties": False,
}
# A value the technician (or anyone with the token) may have stored earlier, shown again in the form.
STORED_REMARK = '</textarea><script>window.__xss=2</script><img src=x onerror="window.__xss=3">'


def bundle_with(demo_dir: Path, tmp: Path, schema: dict[str, Any]) -> Path:
    """The demo bundle (same engines) answering with `schema`."""
    bundle = Path(shutil.copytree(demo_dir, tmp / "bundle"))
    manifest = yaml.safe_load((bundle / "bundle.yaml").read_text())
    manifest["verdict_schema"] = schema
    manifest["generation"] = {"max_tokens": 400}  # room for the nested verdict
    (bundle / "bundle.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))  # the form keeps key order
    return bundle


def start_daemon(tmp: Path, bundle: Path, port: int = 0) -> Daemon:
    cfg = Config(device_id="press-9", data_dir=tmp / "data")
    cfg.model.path, cfg.model.threads = bundle, 2
    cfg.mqtt.enabled = False
    cfg.api.port, cfg.api.host = port, "127.0.0.1"
    cfg.cameras = [CameraConfig(name="cam", source=str(write_sample_video(tmp / "v.avi", frames=30)), fps=10,
                                trigger=TriggerConfig(mode="on_demand"))]
    d = Daemon(cfg)
    d.start()
    wait_for(lambda: d.rigs["cam"].camera.slot.peek() is not None, 10, "a frame")
    return d


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("nested")
    d = start_daemon(tmp, bundle_with(demo_dir, tmp, NESTED_SCHEMA))
    yield d
    d.stop()


def url(d: Daemon, path: str = "/") -> str:
    return f"http://127.0.0.1:{d.api.port}{path}"  # type: ignore[union-attr]


def get_json(d: Daemon, path: str) -> Any:
    with urllib.request.urlopen(url(d, path), timeout=10) as r:
        return json.loads(r.read())


def post_json(d: Daemon, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url(d, path), data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def open_result(browser: Any, d: Daemon, result_id: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 820, "height": 1400})
    page.set_default_timeout(5000)  # a missing field fails fast instead of after Playwright's 30 s
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url(d))
    page.click(f'#insp-list tr[data-id="{result_id}"]', timeout=10000)
    page.wait_for_selector("#review-fields fieldset")
    return page, errors


def by_id(page: Any, element_id: str) -> Any:
    return page.locator(f"[id={json.dumps(element_id)}]")


def status_after_click(page: Any, button: str) -> str:
    page.evaluate("document.getElementById('review-status').textContent = ''")
    page.click(button)
    page.wait_for_function("document.getElementById('review-status').textContent !== ''")
    return str(page.inner_text("#review-status"))


def test_a_technician_corrects_a_nested_verdict_and_the_stored_correction_is_exact(
        nested: Daemon, browser: Any) -> None:
    result = nested.entry.trigger("cam").result(timeout=120)
    verdict = get_json(nested, f"/api/v1/results/{result.id}")["verdict"]
    assert verdict == result.verdict  # the model's verdict, valid against the nested schema
    page, errors = open_result(browser, nested, result.id)
    try:
        # Pre-filled from the verdict.
        assert by_id(page, "rv-location.x").input_value() == str(verdict["location"]["x"])
        assert by_id(page, "rv-findings").locator("li").count() == len(verdict["findings"])
        # A nested value through $ref: first out of range (refused in the page), then fixed.
        by_id(page, "rv-location.x").fill("9999")
        assert status_after_click(page, "#review-correct") == "not saved: location.x: must be at most 640"
        by_id(page, "rv-location.x").fill("17")
        # An array row: make room under maxItems, then add one and fill it.
        findings = list(verdict["findings"])
        if len(findings) == 2:
            by_id(page, "rv-findings[1]--remove").click()
            findings.pop()
        row = len(findings)
        by_id(page, "rv-findings--add").click()
        by_id(page, f"rv-findings[{row}].kind").select_option(label="dent")
        by_id(page, f"rv-findings[{row}].severity").fill("4")
        findings.append({"kind": "dent", "severity": 4})
        assert by_id(page, "rv-findings--add").is_disabled() == (len(findings) == 2)
        # The enum array as checkboxes.
        by_id(page, "rv-tags--0").set_checked(False)
        by_id(page, "rv-tags--1").set_checked(True)
        by_id(page, "rv-tags--2").set_checked(True)
        # The nullable string: typed into, then set to none.
        by_id(page, "rv-operator_note").fill("smudge")
        assert not by_id(page, "rv-operator_note--none").is_checked()  # typing clears "none"
        by_id(page, "rv-operator_note--none").check()
        # oneOf of objects: a JSON textarea, checked before anything is sent.
        by_id(page, "rv-disposition").fill('{"scrap": "yes"')
        assert status_after_click(page, "#review-correct").startswith("not saved: disposition: not valid JSON")
        by_id(page, "rv-disposition").fill('{"scrap": "yes"}')
        assert get_json(nested, f"/api/v1/results/{result.id}").get("review") is None  # nothing landed yet
        assert status_after_click(page, "#review-correct") == "saved: corrected"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "review_form_nested.png"), full_page=True)
        assert errors == []
    finally:
        page.close()
    expected = {"defect": verdict["defect"], "location": {"x": 17, "y": verdict["location"]["y"]},
                "findings": findings, "tags": ["dent", "stain"], "operator_note": None,
                "disposition": {"scrap": "yes"}}
    stored = get_json(nested, f"/api/v1/results/{result.id}")["review"]
    assert stored["state"] == "corrected"
    assert json.dumps(stored["correction"], sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_the_form_is_prefilled_from_the_previous_correction(nested: Daemon, browser: Any) -> None:
    result = nested.entry.trigger("cam").result(timeout=120)
    previous = {"defect": True, "location": {"x": 3, "y": 4}, "findings": [{"kind": "crack", "severity": 5}],
                "tags": ["stain"], "operator_note": None, "disposition": {"rework": True}}
    review = {"action": "correct", "verdict": previous}
    assert post_json(nested, f"/api/v1/results/{result.id}/review", review)[0] == 200
    page, errors = open_result(browser, nested, result.id)
    try:
        assert by_id(page, "rv-findings[0].kind").evaluate("s => s.selectedOptions[0].textContent") == "crack"
        assert by_id(page, "rv-operator_note--none").is_checked()
        assert [by_id(page, f"rv-tags--{i}").is_checked() for i in range(3)] == [False, False, True]
        # Saved unchanged, the form gives back exactly what it was filled with.
        assert status_after_click(page, "#review-correct") == "saved: corrected"
        assert errors == []
    finally:
        page.close()
    assert get_json(nested, f"/api/v1/results/{result.id}")["review"]["correction"] == previous


def test_a_recursive_ref_schema_renders_to_a_bounded_depth_then_as_json(nested: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("window.SchemaForm !== undefined")
        shape = page.evaluate("""() => {
            const schema = {$ref: "#/$defs/part", $defs: {part: {type: "object", required: ["name", "sub"],
                properties: {name: {type: "string", maxLength: 9}, sub: {$ref: "#/$defs/part"}}}}};
            const form = window.SchemaForm.build(schema, {name: "a", sub: {name: "b"}}, "t");
            const textareas = form.el.querySelectorAll("textarea.sf-json");
            textareas[0].value = '{"name": "g", "sub": null}';
            return {fieldsets: form.el.querySelectorAll("fieldset").length + 1, textareas: textareas.length,
                    read: form.read()};
        }""")
    finally:
        page.close()
    assert shape["textareas"] == 1 and shape["fieldsets"] == 6  # 6 $refs deep, then one JSON box
    read = shape["read"]
    assert read["errors"] == [] and read["value"]["name"] == "a" and read["value"]["sub"]["name"] == "b"


def test_a_correction_that_breaks_a_nested_schema_is_a_400_naming_the_path_and_never_lands(nested: Daemon) -> None:
    result = nested.entry.trigger("cam").result(timeout=120)
    bad = json.loads(json.dumps(result.verdict))
    bad["findings"] = [{"kind": "dent", "severity": 9}]
    status, body = post_json(nested, f"/api/v1/results/{result.id}/review", {"action": "correct", "verdict": bad})
    assert status == 400 and body["error"]["message"].startswith("verdict.findings.0.severity:")
    bad["findings"], bad["location"] = [], {"x": "x" * 50_000, "y": 1}
    status, body = post_json(nested, f"/api/v1/results/{result.id}/review", {"action": "correct", "verdict": bad})
    assert status == 400 and body["error"]["message"].startswith("verdict.location.x:")
    assert len(body["error"]["message"]) < 400  # the offending value is not echoed back whole
    assert get_json(nested, f"/api/v1/results/{result.id}").get("review") is None


def test_a_hostile_schema_renders_inert_and_round_trips(tmp_path: Path, demo_dir: Path, browser: Any) -> None:
    d = start_daemon(tmp_path, bundle_with(demo_dir, tmp_path, HOSTILE_SCHEMA))
    try:
        result = d.entry.trigger("cam").result(timeout=120)
        earlier = {"defect": True, ODD_NAME: "fine", "remark": STORED_REMARK}
        assert post_json(d, f"/api/v1/results/{result.id}/review", {"action": "correct", "verdict": earlier})[0] == 200
        page, errors = open_result(browser, d, result.id)
        try:
            field = page.get_by_label(ODD_NAME, exact=True)  # the name is the label's text, markup and all
            assert field.evaluate("s => [...s.options].map(o => o.textContent)") == [XSS, "fine"]
            assert page.locator("#review-fields img, #review-fields b, #review-fields script").count() == 0
            assert by_id(page, "rv-remark").input_value() == STORED_REMARK
            field.select_option(label=XSS)
            by_id(page, "rv-remark").fill("ok")
            assert status_after_click(page, "#review-correct") == "saved: corrected"
            assert page.evaluate("window.__xss") is None
            assert errors == []
        finally:
            page.close()
        stored = get_json(d, f"/api/v1/results/{result.id}")["review"]["correction"]
        assert stored == {"defect": True, ODD_NAME: XSS, "remark": "ok"}
    finally:
        d.stop()


def test_both_nullable_spellings_get_a_none_choice_and_read_back_null(nested: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("window.SchemaForm !== undefined")
        read = page.evaluate("""() => {
            const schema = {type: "object", required: ["a", "b", "c"], properties: {
                a: {type: ["string", "null"], maxLength: 5},
                b: {anyOf: [{type: "integer", minimum: 0}, {type: "null"}]},
                c: {enum: ["x", null]}}};
            const form = window.SchemaForm.build(schema, {a: "abc", b: 3, c: "x"}, "n");
            document.body.appendChild(form.el);
            const before = form.read();
            ["n-a--none", "n-b--none", "n-c--none"].forEach((id) => document.getElementById(id).click());
            return [before, form.read()];
        }""")
    finally:
        page.close()
    assert read[0] == {"value": {"a": "abc", "b": 3, "c": "x"}, "errors": []}
    assert read[1] == {"value": {"a": None, "b": None, "c": None}, "errors": []}


def test_double_quotes_in_names_and_values_stay_text(nested: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("window.SchemaForm !== undefined")
        out = page.evaluate("""() => {
            const name = 'x" onfocus="window.__xss=4" autofocus="', value = '"><img src=x onerror=window.__xss=5>';
            const schema = {type: "object", required: [name], properties: {[name]: {enum: [value, "b"]}}};
            const form = window.SchemaForm.build(schema, {[name]: value}, "q");
            document.body.appendChild(form.el);
            return {names: [...form.el.querySelectorAll("label")].map((l) => l.textContent),
                    options: [...form.el.querySelectorAll("option")].map((o) => o.textContent),
                    elements: form.el.querySelectorAll("img, [onfocus], [autofocus]").length,
                    read: form.read()};
        }""")
        page.wait_for_timeout(100)  # give an injected onerror/onfocus its chance to run
        assert page.evaluate("window.__xss") is None
    finally:
        page.close()
    name, value = 'x" onfocus="window.__xss=4" autofocus="', '"><img src=x onerror=window.__xss=5>'
    assert out["names"] == [name] and out["options"] == [value, "b"] and out["elements"] == 0
    assert out["read"] == {"value": {name: value}, "errors": []}


def test_field_names_like_proto_and_constructor_are_ordinary_fields(nested: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("window.SchemaForm !== undefined")
        text = page.evaluate("""() => {
            const schema = JSON.parse('{"type": "object", "required": ["__proto__", "constructor"], "properties":'
                + ' {"__proto__": {"type": "integer"}, "constructor": {"enum": ["a", "b"]}}}');
            const verdict = JSON.parse('{"__proto__": 7, "constructor": "b", "toString": "kept"}');
            return JSON.stringify(window.SchemaForm.build(schema, verdict, "p").read());
        }""")
    finally:
        page.close()
    assert json.loads(text) == {"value": {"toString": "kept", "__proto__": 7, "constructor": "b"}, "errors": []}


def test_the_form_keeps_rows_within_min_and_max_items_and_checks_bounds_before_sending(
        nested: Daemon, browser: Any) -> None:
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("window.SchemaForm !== undefined")
        out = page.evaluate("""() => {
            const schema = {type: "object", required: ["rows", "code", "any"], properties: {
                rows: {type: "array", minItems: 1, maxItems: 2, items: {type: "integer"}},
                code: {type: "string", minLength: 2, maxLength: 4, pattern: "^[A-Z]+$"},
                any: {anyOf: [{type: "integer"}, {type: "string"}]}}};
            const form = window.SchemaForm.build(schema, {rows: [], code: "ab"}, "b");
            document.body.appendChild(form.el);
            const $ = (id) => document.getElementById(id);
            const seen = {rows: form.el.querySelectorAll("#b-rows li").length,
                          removable: !$("b-rows[0]--remove").disabled, addable: !$("b-rows--add").disabled,
                          first: form.read()};
            $("b-rows[0]").value = "5";
            $("b-rows--add").click();
            $("b-rows[1]").value = "6";
            seen.addableAtMax = !$("b-rows--add").disabled;
            $("b-rows[0]--remove").click();  // the remaining row keeps its value
            $("b-code").value = "OK";
            $("b-any").value = "3";
            seen.second = form.read();
            return seen;
        }""")
    finally:
        page.close()
    assert (out["rows"], out["removable"], out["addable"], out["addableAtMax"]) == (1, False, True, False)
    assert out["first"]["errors"] == ["rows[0]: enter a whole number", "code: must match ^[A-Z]+$", "any: required"]
    assert out["second"] == {"value": {"rows": [6], "code": "OK", "any": 3}, "errors": []}


def test_a_page_left_open_across_a_bundle_update_builds_the_form_from_the_new_schema(
        tmp_path: Path, demo_dir: Path, browser: Any) -> None:
    """OTA or a technician swaps the bundle (same data directory); the page on the line's tablet stays open."""
    d = start_daemon(tmp_path, bundle_with(demo_dir, tmp_path / "old", HOSTILE_SCHEMA))
    port = d.api.port  # type: ignore[union-attr]
    page = None
    try:
        first = d.entry.trigger("cam").result(timeout=120)
        page, errors = open_result(browser, d, first.id)
        assert by_id(page, "rv-remark").count() == 1  # the old schema's form
        d.stop()
        d = start_daemon(tmp_path, bundle_with(demo_dir, tmp_path / "new", NESTED_SCHEMA), port=port)
        second = d.entry.trigger("cam").result(timeout=120)
        page.click(f'#insp-list tr[data-id="{second.id}"]', timeout=15000)
        page.wait_for_selector("#review-fields fieldset [id='rv-location.x']")
        assert by_id(page, "rv-remark").count() == 0
        assert errors == []
    finally:
        if page is not None:
            page.close()
        d.stop()


def test_a_schema_that_nests_large_min_items_gives_a_bounded_form(nested: Daemon, browser: Any) -> None:
    """Three nested arrays of minItems 256 pass the schema budget (the grammar stays small) but would
    pad to 16.7 million fields; the form stops at its field budget and shows JSON boxes instead."""
    leaf = {"type": "array", "items": {"type": "boolean"}, "minItems": 256}
    schema = {"type": "object", "properties": {"grid": {"type": "array", "minItems": 256, "items": {
        "type": "array", "minItems": 256, "items": leaf}}}, "required": ["grid"]}
    page = browser.new_page()
    try:
        page.goto(url(nested))
        page.wait_for_function("!!window.SchemaForm", timeout=10000)
        took_ms, fields, boxes = page.evaluate("""schema => {
            const t0 = performance.now();
            const form = window.SchemaForm.build(schema, undefined, "big");
            const took = performance.now() - t0;
            return [took, form.el.querySelectorAll("input, select, textarea").length,
                    form.el.querySelectorAll("textarea.sf-json").length];
        }""", schema)
        assert fields <= 2000 + 2 * 256 and boxes >= 1, (fields, boxes)  # budget + a box per outer row
        assert took_ms < 5000, took_ms
    finally:
        page.close()


def _post_raw(d: Daemon, path: str, raw: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url(d, path), data=raw, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_hostile_review_bodies_are_400s_naming_the_body(nested: Daemon) -> None:
    result = nested.entry.trigger("cam").result(timeout=120)
    path = f"/api/v1/results/{result.id}/review"
    deep = '{"action": "correct", "verdict": {"defect": true, "tags": ' + "[" * 500 + "]" * 500 + "}}"
    nan = '{"action": "correct", "verdict": {"defect": NaN}}'
    for raw in (deep, nan):
        status, body = _post_raw(nested, path, raw.encode())
        assert status == 400 and body["error"]["field"] == "body", (status, body)
    assert get_json(nested, f"/api/v1/results/{result.id}").get("review") is None  # nothing landed


def test_a_confirmation_stores_no_verdict_sent_with_it(nested: Daemon) -> None:
    result = nested.entry.trigger("cam").result(timeout=120)
    status, body = post_json(nested, f"/api/v1/results/{result.id}/review",
                             {"action": "confirm", "verdict": {"evil": 1}})
    assert status == 200 and body["review"]["correction"] is None
    rows = nested.verdicts.reviews._db.execute(  # the history table, where it used to be stored
        "SELECT correction FROM reviews WHERE result_id = ?", (result.id,)).fetchall()
    assert rows and all(r[0] in (None, "null") for r in rows), rows

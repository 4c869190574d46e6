"""Rails on /v1/chat/completions and POST /api/v1/infer, on a real daemon (demo bundle, llama.cpp).

The demo model has random weights, so answers whose content a rail must see are forced by a JSON
schema (an enum or a const): the grammar makes the answer exactly what the test needs.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from flask.testing import FlaskClient

from edge_runtime.app.daemon import Daemon
from edge_runtime.config import Config, RailsConfig
from edge_runtime.core.samples import part_image
from tests.support.flask_json import json_of
from tests.support.images import encode

JPEG = encode(part_image(3, defect=True), ".jpg")
NOISE = encode(np.random.default_rng(7).integers(0, 255, (480, 640, 3), dtype=np.uint8), ".jpg")


def data_url(image: bytes = JPEG) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(image).decode()


def forced(*values: str) -> dict[str, Any]:
    """A response_format whose every answer is {"word": <one of values>}."""
    schema = {"type": "object", "properties": {"word": {"enum": list(values)}}, "required": ["word"],
              "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "word", "schema": schema}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("rails")
    cfg = Config(device_id="rails-test", data_dir=tmp / "data")
    cfg.model.path = demo_dir
    cfg.model.threads = 2
    cfg.mqtt.enabled = False
    cfg.api.port = 0
    cfg.api.host = "127.0.0.1"
    cfg.api.max_request_mb = 4
    d = Daemon(cfg)
    d.start()
    yield d
    d.stop()


def use_rails(d: Daemon, **rails: Any) -> None:
    """Put a rails section in the live config, as a reload does (a new Config object)."""
    d.running.config = d.config.model_copy(update={"rails": RailsConfig.model_validate(rails)})


@pytest.fixture
def client(daemon: Daemon) -> Iterator[FlaskClient]:
    assert daemon.api is not None
    yield daemon.api.app.test_client()
    use_rails(daemon)  # no rails for the next test


def chat(client: FlaskClient, content: Any, headers: dict[str, str] | None = None, **extra: Any) -> Any:
    body = {"model": "edge-demo-vlm", "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": content}], **extra}
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def refused(response: Any, code: str, status: int = 400, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    error: dict[str, Any] = json_of(response)["error"]
    assert error["code"] == code and error["type"] == "rail_refused"
    assert error["message"].startswith(f"{code}: "), error["message"]
    assert error["param"] == field
    return error


def fired(client: FlaskClient, rail: str, action: str) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    found = re.search(rf'^edge_rail_fired_total\{{action="{action}",rail="{rail}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


# ---- input rails ---------------------------------------------------------------------------------

def test_text_length_counts_text_parts_and_never_a_base64_image(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "text_length", "max_text_chars": 40}])
    image = data_url(NOISE)
    assert len(image) > 100_000  # the data URL alone is thousands of times the text limit
    ok = chat(client, [{"type": "text", "text": "Is the weld continuous?"},
                       {"type": "image_url", "image_url": {"url": image}}])
    assert ok.status_code == 200, ok.get_data(as_text=True)[:300]
    long = chat(client, [{"type": "text", "text": "x" * 30}, {"type": "text", "text": "y" * 11},
                         {"type": "image_url", "image_url": {"url": image}}])
    error = refused(long, "rail_input_text_length", field="messages")
    assert "41 characters" in error["message"] and "at most 40" in error["message"]
    assert fired(client, "rail_input_text_length", "refuse") == 1


def test_text_length_reads_only_the_roles_it_names(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "user_text", "max_text_chars": 10, "roles": ["user"]}])
    def body(user: str) -> dict[str, Any]:
        return {"max_tokens": 4, "messages": [{"role": "system", "content": "s" * 200},
                                              {"role": "user", "content": user}]}
    assert client.post("/v1/chat/completions", json=body("short")).status_code == 200
    refused(client.post("/v1/chat/completions", json=body("eleven char")), "rail_input_user_text", field="messages")


def test_image_count_and_pixels_are_checked_before_decoding(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "no_images", "max_images": 0}])
    refused(chat(client, [{"type": "image_url", "image_url": {"url": data_url()}}]), "rail_input_no_images",
            field="messages")
    assert chat(client, "no picture here").status_code == 200
    use_rails(daemon, input=[{"name": "small_images", "max_image_pixels": 100 * 100}])
    error = refused(chat(client, [{"type": "text", "text": "look"},
                                  {"type": "image_url", "image_url": {"url": data_url(NOISE)}}]),
                    "rail_input_small_images", field="messages.0.content.1.image_url.url")
    assert "640x480" in error["message"]
    multipart = client.post("/api/v1/infer", data={"image": (BytesIO(NOISE), "n.jpg")})
    refused(multipart, "rail_input_small_images", field="image")


def test_regex_and_word_rails_refuse_naming_the_field(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "no_secrets", "regex": r"(?i)pass(word)?\s*[:=]"},
                             {"name": "banned", "words": ["Sabotage", "c++"], "message": "not on this line"}])
    refused(chat(client, [{"type": "text", "text": "hello"}, {"type": "text", "text": "my PASSWORD: hunter2"}]),
            "rail_input_no_secrets", field="messages.0.content.1.text")
    error = refused(chat(client, "plan the sabotage now"), "rail_input_banned", field="messages.0.content")
    assert error["message"] == "rail_input_banned: not on this line"
    refused(chat(client, "written in C++ today"), "rail_input_banned", field="messages.0.content")
    assert chat(client, "saboteurs are not whole words of the list").status_code == 200
    refused(client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode(), "prompt": "pass = 1"}),
            "rail_input_no_secrets", field="prompt")


def test_rewrite_replaces_the_matching_text(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "scrub", "words": ["competitor"], "action": "rewrite",
                              "rewrite": {"replace": "Describe the part."}}])
    rewritten = json_of(chat(client, "what does the competitor charge?", response_format=forced("a", "b", "c")))
    use_rails(daemon)
    direct = json_of(chat(client, "Describe the part.", response_format=forced("a", "b", "c")))
    plain = json_of(chat(client, "what does the competitor charge?", response_format=forced("a", "b", "c")))
    # The model saw exactly the replacement: same prompt length and the same greedy answer.
    assert rewritten["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert rewritten["usage"]["prompt_tokens"] != plain["usage"]["prompt_tokens"]
    assert rewritten["choices"][0]["message"] == direct["choices"][0]["message"]
    assert fired(client, "rail_input_scrub", "rewrite") == 1


def test_rewrite_adds_a_system_instruction(daemon: Daemon, client: FlaskClient) -> None:
    rule = "Answer only about the part in the picture."
    use_rails(daemon, input=[{"name": "steer", "regex": "(?i)weather", "action": "rewrite",
                              "rewrite": {"system": rule}}])
    steered = json_of(chat(client, "how is the weather?"))
    use_rails(daemon)
    explicit = client.post("/v1/chat/completions", json={"max_tokens": 48, "messages": [
        {"role": "system", "content": rule}, {"role": "user", "content": "how is the weather?"}]})
    assert steered["usage"] == json_of(explicit)["usage"]
    assert steered["choices"][0]["message"] == json_of(explicit)["choices"][0]["message"]


def test_access_rail_limits_models_and_schemas_per_token(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "integrator", "access": {"token": "tok-integrator",
                                                               "schemas": ["word"]}},
                             {"name": "served_only", "access": {"models": ["edge-demo-vlm"]}}])
    as_integrator = {"Authorization": "Bearer tok-integrator"}
    refused(chat(client, "hi", headers=as_integrator), "rail_input_integrator", 403, "response_format")
    assert chat(client, "hi", headers=as_integrator, response_format=forced("a")).status_code == 200
    assert chat(client, "hi").status_code == 200  # another caller: the token's rule does not apply
    refused(chat(client, "hi", model="default"), "rail_input_served_only", 403, "model")
    infer = client.post("/api/v1/infer", json={"image": base64.b64encode(JPEG).decode()}, headers=as_integrator)
    refused(infer, "rail_input_integrator", 403, "response_format")  # infer answers in the bundle's `verdict`


@pytest.mark.parametrize("token", ["correct horse battery staple", "sékrit"])
def test_an_access_rail_token_with_inner_spaces_or_a_latin1_letter_matches_through_the_real_server(
        daemon: Daemon, client: FlaskClient, token: str) -> None:
    # Validated as a config file is, then applied as a reload applies it; requests sends the header as
    # latin-1 and waitress decodes it so, inner spaces kept (auth's partition, the rails' bearer()).
    assert daemon.api is not None
    before = daemon.config
    cfg = Config.model_validate({"device_id": "rails-test", "api": {"token": token},
                                 "rails": {"input": [{"name": "integrator",
                                                      "access": {"token": token, "schemas": ["word"]}}]}})
    daemon.api.apply(before.api.model_copy(update={"token": cfg.api.token}))
    daemon.running.config = before.model_copy(update={"api": daemon.api.cfg, "rails": cfg.rails})
    try:
        url = f"http://127.0.0.1:{daemon.api.port}/v1/chat/completions"
        body: dict[str, Any] = {"model": "edge-demo-vlm", "max_tokens": 4,
                                "messages": [{"role": "user", "content": "hi"}]}
        right = requests.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert right.status_code == 403, right.text[:300]  # authenticated, and the token's rail applied
        assert right.json()["error"]["code"] == "rail_input_integrator"
        wrong = requests.post(url, json=body, headers={"Authorization": f"Bearer {token[:-1]}"}, timeout=60)
        assert wrong.status_code == 401, wrong.text[:300]
    finally:
        daemon.api.apply(before.api)
        daemon.running.config = before


def test_a_catastrophic_regex_refuses_instead_of_stalling(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "evil", "regex": r"(a+)+$"}], regex_budget_ms=20)
    error = refused(chat(client, "a" * 5000 + "b"), "rail_input_evil", field="messages.0.content")
    assert "did not finish" in error["message"]
    assert client.get("/healthz").status_code == 200


def test_text_beyond_the_scan_limit_is_refused_not_searched_in_part(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "banned", "words": ["sabotage"]}], max_scan_chars=1024)
    refused(chat(client, "x" * 1100 + " sabotage"), "rail_input_scan_limit", field="messages")


def test_a_refusal_is_logged_once_with_the_rule_and_request_id(daemon: Daemon, client: FlaskClient,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    use_rails(daemon, input=[{"name": "banned", "words": ["sabotage"]}])
    with caplog.at_level(logging.INFO, logger="edge_runtime.api.rails"):
        response = chat(client, "sabotage", headers={"X-Request-Id": "req-42"})
    refused(response, "rail_input_banned", field="messages.0.content")
    assert response.headers["X-Request-Id"] == "req-42"
    lines = [r for r in caplog.records if r.name == "edge_runtime.api.rails"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "rail_input_banned" in lines[0].getMessage() and "req-42" in lines[0].getMessage()


# ---- output rails --------------------------------------------------------------------------------

def test_output_regex_refuses_and_filters(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, output=[{"name": "leak", "regex": "hunter[0-9]"}])
    refused(chat(client, "say it", response_format=forced("hunter2")), "rail_output_leak", 422)
    assert fired(client, "rail_output_leak", "refuse") == 1
    use_rails(daemon, output=[{"name": "leak", "regex": "hunter[0-9]", "action": "filter", "replacement": "***"}])
    answer = json_of(chat(client, "say it", response_format=forced("hunter2 is it")))
    assert json.loads(answer["choices"][0]["message"]["content"]) == {"word": "*** is it"}  # still JSON
    assert fired(client, "rail_output_leak", "filter") == 1


def test_output_words_filter_plain_text(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon)
    plain = json_of(chat(client, "hello", max_tokens=24))["choices"][0]["message"]["content"]
    word = next((w for w in re.findall(r"\w{3,}", plain) if re.fullmatch(r"\w+", w)), None)
    if word is None:
        pytest.skip(f"the random model wrote no word of 3+ letters: {plain!r}")
    use_rails(daemon, output=[{"name": "words", "words": [word], "action": "filter"}])
    filtered = json_of(chat(client, "hello", max_tokens=24))["choices"][0]["message"]["content"]
    assert "[redacted]" in filtered and not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", filtered, re.I)


def test_output_json_conditions_reuse_the_rules_conditions(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, output=[{"name": "no_scrap", "when": [{"field": "word", "in": ["scrap", "discard"]}]}])
    refused(chat(client, "verdict?", response_format=forced("scrap")), "rail_output_no_scrap", 422)
    assert chat(client, "verdict?", response_format=forced("keep")).status_code == 200
    use_rails(daemon, output=[{"name": "no_scrap", "when": [{"field": "word", "regex": "^scr"}],
                               "action": "filter"}])
    answer = json_of(chat(client, "verdict?", response_format=forced("scrap")))
    assert json.loads(answer["choices"][0]["message"]["content"]) == {"word": "[redacted]"}


def test_output_schema_rail_refuses_an_answer_outside_it(daemon: Daemon, client: FlaskClient) -> None:
    schema = {"type": "object", "properties": {"word": {"enum": ["ok", "nok"]}}, "required": ["word"]}
    use_rails(daemon, output=[{"name": "shape", "json_schema": schema}])
    assert chat(client, "verdict?", response_format=forced("nok")).status_code == 200
    refused(chat(client, "verdict?", response_format=forced("maybe")), "rail_output_shape", 422)
    refused(chat(client, "free text", max_tokens=8), "rail_output_shape", 422)  # not JSON at all


def test_a_json_answer_cut_off_by_max_tokens_is_refused_by_a_when_rail(daemon: Daemon, client: FlaskClient) -> None:
    """`{"defect": true, "notes": "...` cut off does not parse: a `when` rail on `defect` never fired
    and the client read `"defect": true` anyway. An answer that opens as JSON but does not parse is
    refused as unchecked."""
    schema = {"type": "object", "properties": {"defect": {"const": True},
                                               "notes": {"enum": ["the seam is open along the whole left edge"]}},
              "required": ["defect", "notes"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    cut = None
    for max_tokens in range(4, 40, 2):  # the shortest answer that shows `true` and is cut off
        answer = json_of(chat(client, "verdict?", response_format=fmt, max_tokens=max_tokens))["choices"][0]
        if answer["finish_reason"] == "length" and "true" in answer["message"]["content"]:
            cut = max_tokens
            break
    assert cut is not None, "no max_tokens cut the answer after `true`"
    use_rails(daemon, output=[{"name": "defect", "when": [{"field": "defect", "equals": True}]}])
    error = refused(chat(client, "verdict?", response_format=fmt, max_tokens=cut), "rail_output_defect", 422)
    assert "does not parse" in error["message"]
    refused(chat(client, "verdict?", response_format=fmt), "rail_output_defect", 422)  # whole: the rail fires
    assert chat(client, "free text", max_tokens=8).status_code == 200  # plain text: nothing to read


def _flipping_instruction(client: FlaskClient) -> tuple[str, str, str]:
    """An instruction that changes the greedy answer of the test prompt: (instruction, first, second)."""
    fmt = forced("alpha", "beta", "gamma", "delta")
    first = json_of(chat(client, "Pick one.", response_format=fmt))["choices"][0]["message"]["content"]
    candidates = ["Pick the last one.", *(f"{w} " * k for k in (1, 3) for w in ("beta", "gamma", "alpha", "delta"))]
    for instruction in candidates:
        body = {"max_tokens": 48, "response_format": fmt, "messages": [
            {"role": "system", "content": instruction}, {"role": "user", "content": "Pick one."}]}
        second = json_of(client.post("/v1/chat/completions", json=body))["choices"][0]["message"]["content"]
        if second != first:
            return instruction, first, second
    pytest.fail("no instruction changed the greedy answer")


def test_reask_regenerates_once_with_the_instruction(daemon: Daemon, client: FlaskClient) -> None:
    instruction, first, second = _flipping_instruction(client)
    word = json.loads(first)["word"]
    use_rails(daemon, output=[{"name": "again", "regex": f'"{word}"', "action": "reask",
                               "reask": {"prompt": instruction}}])
    answer = json_of(chat(client, "Pick one.", response_format=forced("alpha", "beta", "gamma", "delta")))
    assert answer["choices"][0]["message"]["content"] == second
    assert fired(client, "rail_output_again", "reask") == 1
    # A rail that fires on every answer: one regeneration, then a refusal naming it.
    use_rails(daemon, output=[{"name": "always", "regex": "word", "action": "reask", "reask": {"prompt": "Again."}}])
    error = refused(chat(client, "Pick one.", response_format=forced("alpha")), "rail_output_always", 422)
    assert "after one regeneration" in error["message"]
    assert fired(client, "rail_output_always", "reask") == 1


def test_reask_budget_spent_refuses_and_is_counted(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, output=[{"name": "budgeted", "regex": "word", "action": "reask",
                               "reask": {"prompt": "Again."}}], reasks_per_minute=0)
    error = refused(chat(client, "Pick one.", response_format=forced("alpha")), "rail_output_budgeted", 422)
    assert "rails.reasks_per_minute" in error["message"]
    assert fired(client, "rail_output_budgeted", "reask_skipped") == 1
    assert fired(client, "rail_output_budgeted", "reask") == 0


def test_infer_output_rails_read_the_verdict(daemon: Daemon, client: FlaskClient) -> None:
    image = base64.b64encode(JPEG).decode()
    use_rails(daemon, output=[{"name": "any_verdict", "when": [{"field": "defect", "in": [True, False]}]}])
    refused(client.post("/api/v1/infer", json={"image": image}), "rail_output_any_verdict", 422)
    use_rails(daemon, output=[{"name": "notes", "when": [{"field": "notes", "regex": r"^[^\[]"}],
                               "action": "filter"}])
    result = json_of(client.post("/api/v1/infer", json={"image": image}))
    assert result["verdict"]["notes"] == "[redacted]" and json.loads(result["text"]) == result["verdict"]
    # A redaction the condition still matches cannot hide what the rail is for: refused instead.
    use_rails(daemon, output=[{"name": "notes", "when": [{"field": "notes", "regex": "."}], "action": "filter"}])
    error = refused(client.post("/api/v1/infer", json={"image": image}), "rail_output_notes", 422)
    assert "after redaction" in error["message"]


def test_infer_verdicts_reach_the_event_stream_only_as_the_rails_passed_them(daemon: Daemon,
                                                                             client: FlaskClient) -> None:
    assert daemon.api is not None
    hub = daemon.api.events
    image = base64.b64encode(JPEG).decode()

    def kept_after(mark: int) -> list[tuple[int, dict[str, Any]]]:
        q, backlog = hub.subscribe(after=mark)
        hub.unsubscribe(q)
        return backlog

    def api_events_after(mark: int) -> list[dict[str, Any]]:
        return [event for _, event in kept_after(mark) if event.get("camera") == "api"]

    kept = kept_after(0)
    mark = kept[-1][0] if kept else 0
    use_rails(daemon, output=[{"name": "any_verdict", "when": [{"field": "defect", "in": [True, False]}]}])
    refused(client.post("/api/v1/infer", json={"image": image}), "rail_output_any_verdict", 422)
    assert api_events_after(mark) == []  # the refused verdict never reached the live stream
    use_rails(daemon, output=[{"name": "notes", "when": [{"field": "notes", "regex": r"^[^\[]"}],
                               "action": "filter"}])
    answered = json_of(client.post("/api/v1/infer", json={"image": image}))
    published = api_events_after(mark)
    assert len(published) == 1 and published[0]["verdict"] == answered["verdict"]
    assert published[0]["verdict"]["notes"] == "[redacted]"


def test_infer_input_rails_read_the_prompt_before_the_image_is_decoded(daemon: Daemon, client: FlaskClient) -> None:
    use_rails(daemon, input=[{"name": "banned", "words": ["sabotage"]}])
    not_base64 = "!" * 64  # decoding it would answer 400 `image` first
    refused(client.post("/api/v1/infer", json={"image": not_base64, "prompt": "sabotage the seam"}),
            "rail_input_banned", 400, "prompt")
    form = {"image": (BytesIO(b"not an image"), "part.jpg"), "prompt": "sabotage the seam"}
    refused(client.post("/api/v1/infer", data=form, content_type="multipart/form-data"),
            "rail_input_banned", 400, "prompt")


# ---- streaming and the live config ---------------------------------------------------------------

@pytest.fixture(scope="module")
def openai_client(daemon: Daemon) -> Any:
    from openai import OpenAI
    assert daemon.api is not None
    return OpenAI(base_url=f"http://127.0.0.1:{daemon.api.port}/v1", api_key="unused", max_retries=0)


def test_a_streamed_answer_is_checked_before_its_first_byte(daemon: Daemon, openai_client: Any) -> None:
    import openai
    use_rails(daemon, output=[{"name": "stream_leak", "regex": "hunter[0-9]"}])
    try:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            openai_client.chat.completions.create(model="edge-demo-vlm", stream=True, max_tokens=48,
                                                  response_format=forced("hunter2"),
                                                  messages=[{"role": "user", "content": "say it"}])
        assert caught.value.code == "rail_output_stream_leak"  # an HTTP error, not a stream that breaks off
        use_rails(daemon, output=[{"name": "stream_leak", "regex": "hunter[0-9]", "action": "filter"}])
        chunks = list(openai_client.chat.completions.create(
            model="edge-demo-vlm", stream=True, max_tokens=48, response_format=forced("hunter2"),
            messages=[{"role": "user", "content": "say it"}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert json.loads(text) == {"word": "[redacted]"} and chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finally:
        use_rails(daemon)


def test_input_rails_refuse_a_stream_before_it_starts(daemon: Daemon, openai_client: Any) -> None:
    import openai
    use_rails(daemon, input=[{"name": "banned", "words": ["sabotage"]}])
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            openai_client.chat.completions.create(model="edge-demo-vlm", stream=True,
                                                  messages=[{"role": "user", "content": "sabotage"}])
        assert caught.value.code == "rail_input_banned"
    finally:
        use_rails(daemon)


# Four choices of the model, so a live stream has a piece for each (a one-value enum is all forced: one piece).
FOUR_CHOICES = {"type": "json_schema", "json_schema": {"name": "words", "schema": {
    "type": "object", "required": ["words"], "additionalProperties": False, "properties": {"words": {
        "type": "array", "minItems": 4, "maxItems": 4, "items": {"enum": ["alpha", "beta", "gamma", "delta"]}}}}}}


def test_only_output_rails_hold_a_stream(daemon: Daemon, openai_client: Any) -> None:
    def chunks() -> list[Any]:
        return list(openai_client.chat.completions.create(
            model="edge-demo-vlm", stream=True, max_tokens=48, response_format=FOUR_CHOICES,
            messages=[{"role": "user", "content": "say it"}]))

    try:
        use_rails(daemon, input=[{"name": "banned", "words": ["sabotage"]}])
        live = chunks()
        assert len(live) > 4  # role, one chunk per piece as it is generated, finish
        use_rails(daemon, output=[{"name": "leak", "regex": "hunter[0-9]"}])
        held = chunks()
        assert len(held) == 3  # role, the whole checked answer, finish
        text = "".join(c.choices[0].delta.content or "" for c in live if c.choices)
        assert held[1].choices[0].delta.content == text
    finally:
        use_rails(daemon)

"""The `rails:` section: refused at load with the key and line, and applied by a reload."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from edge_runtime.config import parse_config
from edge_runtime.core.errors import ConfigError
from tests.support.file_daemon import daemon_from_file


@pytest.mark.parametrize(("yaml", "message"), [
    ("rails:\n  input:\n    - {name: bad, regex: '(unclosed'}\n", "rails.input.0.regex: Value error, not a valid"),
    ("rails:\n  input:\n    - {name: bad, regex: '" + "a" * 201 + "'}\n", "at most 200 characters"),
    ("rails:\n  input:\n    - {name: two, max_images: 1, max_text_chars: 9}\n", "give exactly one of"),
    ("rails:\n  input:\n    - {name: len, max_text_chars: 9, action: rewrite, rewrite: {system: x}}\n",
     "rewrite works with regex and words only"),
    ("rails:\n  input:\n    - {name: rw, words: [a], action: rewrite}\n", "needs rewrite"),
    ("rails:\n  input:\n    - {name: scan_limit, words: [a]}\n", "is reserved"),
    ("rails:\n  input:\n    - {name: Bad-Name, words: [a]}\n", "should match pattern"),
    ("rails:\n  input:\n    - {name: w, words: ['  ']}\n", "may not be empty"),
    ("rails:\n  input:\n    - {name: a, words: [x]}\n    - {name: a, words: [y]}\n", "repeated: a"),
    ("rails:\n  output:\n    - {name: s, json_schema: {type: object}, action: filter}\n", "cannot filter"),
    ("rails:\n  output:\n    - {name: s, json_schema: {type: nope}}\n", "not a valid JSON schema"),
    ("rails:\n  output:\n    - {name: s, json_schema: {patternProperties: {'^a': {}}}}\n",
     "patternProperties is not supported"),
    ("rails:\n  output:\n    - {name: s, json_schema: {properties: {a: {pattern: '(x'}}}}\n",
     "not a valid JSON schema"),
    ("rails:\n  output:\n    - {name: s, json_schema: {$ref: 'https://example.com/s.json'}}\n",
     "points outside the schema"),
    ("rails:\n  output:\n    - {name: s, json_schema: {properties: {a: {$ref: '#/$defs/gone'}}}}\n",
     "does not resolve inside the schema"),
    ("rails:\n  output:\n    - {name: r, regex: x, action: reask}\n", "needs reask"),
    ("rails:\n  output:\n    - {name: c, when: [{field: a, equals: 1, gt: 0}]}\n", "exactly one of equals"),
    ("rails:\n  regex_budget_ms: 0\n", "greater than or equal to 5"),
    ("rails:\n  regex_budget_ms: 15\n  input:\n    - {name: a, words: [x]}\n    - {name: b, regex: y}\n",
     "leaves each under 10 ms"),
])
def test_bad_rails_are_refused_at_load_naming_the_key_and_line(yaml: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"<config>:\d+: rails[.:]") as caught:
        parse_config(yaml)
    assert message in str(caught.value), str(caught.value)


def test_a_valid_rails_section_loads() -> None:
    cfg = parse_config("""
rails:
  input:
    - {name: text_length, max_text_chars: 2000}
    - {name: images, max_images: 1}
    - {name: pixels, max_image_pixels: 4000000}
    - {name: secrets, regex: '(?i)password\\s*[:=]'}
    - {name: steer, words: [weather, stocks], action: rewrite, rewrite: {system: Answer about the part.}}
    - {name: integrator, access: {token: abc, schemas: [verdict, text]}}
  output:
    - {name: leak, regex: 'hunter[0-9]', action: filter}
    - {name: scrap, when: [{field: category, in: [scrap]}], action: reask, reask: {prompt: Look again.}}
    - {name: shape, json_schema: {type: object, required: [defect]}}
""")
    assert [r.kind for r in cfg.rails.input] == ["max_text_chars", "max_images", "max_image_pixels", "regex",
                                                 "words", "access"]
    assert [r.kind for r in cfg.rails.output] == ["regex", "when", "json_schema"]


def _write(path: Path, demo_dir: Path, words: list[str]) -> None:
    path.write_text(f"""
device_id: rails-reload
data_dir: {path.parent / 'data'}
model: {{path: {demo_dir}, threads: 2}}
mqtt: {{enabled: false}}
api: {{host: 127.0.0.1, port: 0}}
rails:
  input:
    - {{name: banned, words: {words}}}
""")


def test_a_reload_that_changes_rails_takes_effect(tmp_path: Path, demo_dir: Path) -> None:
    config = tmp_path / "config.yaml"
    _write(config, demo_dir, ["sabotage"])
    with daemon_from_file(config) as started:
        d = started.daemon
        assert d.api is not None
        client = d.api.app.test_client()

        def ask(text: str) -> int:
            body = {"max_tokens": 4, "messages": [{"role": "user", "content": text}]}
            return client.post("/v1/chat/completions", json=body).status_code

        assert ask("sabotage") == 400 and ask("strike") == 200
        _write(config, demo_dir, ["strike"])
        changes = d.reload()
        assert "rails.input" in " ".join(changes["applied"]), changes
        assert ask("sabotage") == 200 and ask("strike") == 400
        image = base64.b64encode(b"not needed").decode()  # refused by the rail before the image is read
        infer = client.post("/api/v1/infer", json={"image": image, "prompt": "strike"})
        assert infer.status_code == 400 and infer.json is not None
        assert infer.json["error"]["code"] == "rail_input_banned"

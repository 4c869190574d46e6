"""Ask edge-runtime through NeMo Guardrails: `python ask.py CONFIG_DIR MESSAGE` prints one JSON object,
{"content", "calls": [{"task", "prompt", "completion"}], "error"}. Run with the Python that has
`nemoguardrails` installed (tests/api/test_rails_nemo.py runs it in its own process)."""

from __future__ import annotations

import json
import sys


def main() -> None:
    from nemoguardrails import LLMRails, RailsConfig

    config_dir, message = sys.argv[1], sys.argv[2]
    rails = LLMRails(RailsConfig.from_path(config_dir))
    out: dict[str, object] = {"content": None, "calls": [], "error": None}
    try:
        answer = rails.generate(messages=[{"role": "user", "content": message}])
        out["content"] = answer["content"] if isinstance(answer, dict) else str(answer)
    except Exception as exc:  # noqa: BLE001 - reported to the caller as data
        out["error"] = f"{type(exc).__name__}: {exc}"
    info = rails.explain()
    out["calls"] = [{"task": c.task, "prompt": c.prompt, "completion": c.completion} for c in info.llm_calls]
    print(json.dumps(out))


if __name__ == "__main__":
    main()

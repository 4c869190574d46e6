"""What the two guarded endpoints hand the rails and take back: `/v1/chat/completions` (messages,
response formats, generations) and `POST /api/v1/infer` (a prompt and a Result). The rails
themselves are `engine.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import request

from edge_runtime.api.models import Message
from edge_runtime.api.rails.engine import Rails
from edge_runtime.api.rails.request import Answer, RailRequest, TextPart
from edge_runtime.core.device import ChatOutput
from edge_runtime.core.result import Result


def bearer() -> str | None:
    """The Bearer token the request presented (already checked by auth when one is configured)."""
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


def chat_request(messages: list[Message], rid: str, model: str, schema: str) -> RailRequest:
    """A chat request as input rails read it: text parts with their fields, and the image count."""
    texts, images = [], 0
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            texts.append(TextPart(f"messages.{i}.content", m.role, m.content))
            continue
        for j, part in enumerate(m.content or []):
            if part.type == "text" and part.text is not None:
                texts.append(TextPart(f"messages.{i}.content.{j}.text", m.role, part.text))
            elif part.type == "image_url":
                images += 1
    return RailRequest(rid, texts, images, model, schema, bearer())


def rewrite_messages(messages: list[Message], texts: dict[str, str]) -> None:
    """Put an input rail's replacement texts in place (fields as `chat_request` named them)."""
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            m.content = texts.get(f"messages.{i}.content", m.content)
            continue
        for j, part in enumerate(m.content or []):
            part.text = texts.get(f"messages.{i}.content.{j}.text", part.text)


def schema_name(fmt: dict[str, Any] | None) -> str:
    """The response format as access rails name it: a json_schema's name, `text`, `json_object`."""
    if not fmt or fmt.get("type") in (None, "text"):
        return "text"
    if fmt["type"] == "json_schema":
        return str((fmt.get("json_schema") or {}).get("name") or "response")
    return str(fmt["type"])


def usage(gens: list[ChatOutput]) -> dict[str, int]:
    prompt, completion = sum(g.prompt_tokens for g in gens), sum(g.tokens for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def checked_chat(rails: Rails, gen: ChatOutput, regenerate: Callable[[str], ChatOutput], rid: str
                 ) -> tuple[str, dict[str, int], str]:
    """The answer after the output rails (filtered, or regenerated once), the usage of every
    generation it took, and the finish reason of the one sent."""
    gens = [gen]

    def reask(instruction: str) -> Answer:
        gens.append(regenerate(instruction))
        return Answer(gens[-1].text)

    answer = rails.check_output(Answer(gen.text), reask, rid)
    return answer.text, usage(gens), gens[-1].finish_reason


def infer_prompt(rails: Rails, rid: str, prompt: str | None, model: str) -> str | None:
    """REST infer's prompt through the input rails (one image; the response format is the bundle's
    `verdict`); a rewrite's instruction goes in front of the prompt (infer has no system text)."""
    texts = [TextPart("prompt", "user", prompt)] if prompt is not None else []
    rewrites = rails.check_input(RailRequest(rid, texts, 1, model, "verdict", bearer()))
    if prompt is None:
        return None
    prompt = rewrites.texts.get("prompt", prompt)
    return "\n".join([*rewrites.system, prompt])


def checked_result(rails: Rails, result: Result, again: Callable[[str], Result], rid: str) -> dict[str, Any]:
    """REST infer's Result through the output rails: `when` and schema rails read the verdict, regex
    and word rails its text; a reask inspects the same image again with the instruction added."""
    results = [result]

    def reask(instruction: str) -> Answer:
        results.append(again(f"{result.prompt}\n{instruction}"))
        return Answer(results[-1].text, results[-1].verdict)

    answer = rails.check_output(Answer(result.text, result.verdict), reask, rid)
    out = results[-1].to_dict()
    if answer.text != results[-1].text:  # filtered: the verdict and text as redacted
        out["text"] = answer.text
        out["verdict"] = answer.data if isinstance(answer.data, dict) else out["verdict"]
    return out

"""The bundle's prompt template from a GGUF's jinja chat template, rendered safely.

A GGUF is untrusted input, and so is its `tokenizer.chat_template`: it is refused above a size bound,
rendered in jinja2's `ImmutableSandboxedEnvironment` (no attribute tricks, no mutation of the
arguments), in a child process with a time limit and a memory limit (a sandboxed template can still
loop for ever or build a huge string), and its output is bounded. It is rendered with sentinel strings
as the system text, the image and the question; the sentinels must come out exactly once each and in
order, or the template is refused and `--prompt-template` is required.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

MAX_TEMPLATE = 128 * 1024     # characters (real chat templates: 1-20 kB)
MAX_OUTPUT = 64 * 1024        # characters of one rendered prompt
RENDER_SECONDS = 5.0
RENDER_MEMORY = 1 << 30       # bytes of address space for the child
SENTINEL = {"system": "\x01edge-system\x01", "image": "\x01edge-image\x01", "prompt": "\x01edge-prompt\x01"}


class TemplateRefused(ValueError):
    """The chat template cannot give a prompt template; the message is one sentence."""


def _attempts() -> list[tuple[list[dict[str, Any]], bool]]:
    """Message lists to try, string contents first (what llama.cpp's own chat code passes), then the
    list-of-parts form many vision templates iterate over; with a system message, then without."""
    s, i, p = SENTINEL["system"], SENTINEL["image"], SENTINEL["prompt"]
    out: list[tuple[list[dict[str, Any]], bool]] = []
    for system in (True, False):
        for parts in (False, True):
            def content(text: str, parts: bool = parts) -> Any:
                return [{"type": "text", "text": text}] if parts else text
            msgs = [{"role": "user", "content": content(i + p)}]
            if system:
                msgs.insert(0, {"role": "system", "content": content(s)})
            out.append((msgs, system))
    return out


def _render_all(template: str, bos: str, eos: str) -> dict[str, Any]:
    """In the child: render every attempt; return the first that keeps the sentinels, or the reasons."""
    import datetime

    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(str(message)[:200])

    def tojson(value: Any, indent: int | None = None, **_: Any) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens): the body as is."""

        tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares `tags` as a class-level set

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", Generation])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.date(2026, 1, 1).strftime(str(fmt)))
    try:
        compiled = env.from_string(template)
    except TemplateError as exc:
        return {"error": f"it is not valid jinja ({str(exc)[:160]})"}
    reasons = []
    for messages, system in _attempts():
        try:
            # tools / documents left undefined, as when a chat has none: `if tools` is false, `for t in tools` empty
            text = compiled.render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)
        except MemoryError:
            return {"error": f"rendering it needs more than {RENDER_MEMORY >> 20} MiB of memory"}
        except Exception as exc:  # noqa: BLE001 - a template may raise anything; each attempt reports why
            reasons.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            continue
        if len(text) > MAX_OUTPUT:
            return {"error": f"it renders {len(text)} characters for a one-line prompt (limit {MAX_OUTPUT})"}
        wanted = ("system", "image", "prompt") if system else ("image", "prompt")
        counts = {k: text.count(SENTINEL[k]) for k in wanted}
        if all(n == 1 for n in counts.values()):
            order = [text.index(SENTINEL[k]) for k in wanted]
            if order == sorted(order):
                return {"text": text}
            reasons.append("it moves the question before the image")
        elif any(n > 1 for n in counts.values()):
            reasons.append("it writes a message twice")
        else:
            reasons.append("it does not keep the message text as is")
    return {"error": "; ".join(dict.fromkeys(reasons))}


def derive_prompt_template(chat_template: str, *, bos: str = "", eos: str = "", add_bos: bool = False,
                           timeout: float = RENDER_SECONDS) -> str:
    """prompt.template ({system}, {image}, {prompt}) from a chat template, or TemplateRefused."""
    if len(chat_template) > MAX_TEMPLATE:
        raise TemplateRefused(f"the chat template is {len(chat_template)} characters long (limit {MAX_TEMPLATE})")
    job = json.dumps({"template": chat_template, "bos": bos, "eos": eos})
    try:
        done = subprocess.run([sys.executable, "-c", "from edge_runtime_models.chat_template import child; child()"],
                              input=job, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise TemplateRefused(f"rendering the chat template took longer than {timeout:g} s") from None
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        why = "ran out of memory" if "MemoryError" in done.stderr else f"exited with code {done.returncode}"
        raise TemplateRefused(f"rendering the chat template failed (it {why})") from None
    if "error" in result:
        raise TemplateRefused(f"the chat template cannot be used: {result['error']}")
    text = str(result["text"]).replace("{", "{{").replace("}", "}}")
    for key, sentinel in SENTINEL.items():
        text = text.replace(sentinel, "{" + key + "}")
    if add_bos and bos and not text.startswith(bos):
        text = bos + text  # llama.cpp would add BOS when tokenizing; our runtime tokenizes the template as is
    return text


def child() -> None:
    """The child process: a job on stdin, the result on stdout (JSON), in a bounded address space."""
    import resource

    job = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    try:
        result = _render_all(job["template"], job["bos"], job["eos"])
    except MemoryError:
        result = {"error": "rendering it ran out of memory"}
    except RecursionError:
        result = {"error": "rendering it recursed too deep"}
    sys.stdout.write(json.dumps(result))

"""Encodings + text -> the token sequence of one prompt: (prefix, image part, suffix).

The bundle's prompt template with the image in place: an exported model's image tokens
(prompt_layout.py), libmtmd's media segments with their projector markers, or a program's references
before the frame (programs.py). The prompt texts are tokenized once (token_cache.py) and bounded
before they are tokenized.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Sequence

import numpy as np

from edge_runtime.core.batch import Encoded
from edge_runtime.core.bundle.manifest import Bundle, Manifest
from edge_runtime.core.device import ChatJob
from edge_runtime.core.errors import BundleError, InferenceError, InputError
from edge_runtime.inference.clips import ClipEncoded
from edge_runtime.inference.encoding import MediaEncoded
from edge_runtime.inference.llm.feed import Head, ImagePart, Segment
from edge_runtime.inference.llm.model import LanguageModel
from edge_runtime.inference.programs import LoadedProgram
from edge_runtime.inference.prompt_layout import image_prompt, split_at_image_tokens
from edge_runtime.inference.token_cache import TokenCache


def around_image(template: str, system: str, prompt: str) -> tuple[str, str]:
    """The template's text before and after its `{image}` slot, with `system` and `prompt` filled in as
    str.format fills them. The template is cut, not the filled text: a client's text may hold anything
    (a marker searched for in the filled text could be forged, e.g. a prompt holding "\\x00image\\x00")."""
    halves, side = ["", ""], 0
    for literal, name, _, _ in string.Formatter().parse(template):
        halves[side] += literal
        if name == "image":
            side = 1
        elif name is not None:
            halves[side] += {"system": system, "prompt": prompt}[name]
    return halves[0], halves[1]


def slot_texts(template: str, system: str, prompt: str, image_at: Sequence[int]) -> list[str]:
    """The template filled with `system` and `prompt`, cut where each image goes: at `image_at` (offsets
    into `prompt`, ascending), not at the template's `{image}` slot (which is left empty). One more text
    than images. A client's text is never searched for a marker (around_image)."""
    cuts = [0, *image_at, len(prompt)]
    pieces = [prompt[a:b] for a, b in itertools.pairwise(cuts)]
    texts = [""]
    for literal, name, _, _ in string.Formatter().parse(template):
        texts[-1] += literal
        if name == "system":
            texts[-1] += system
        elif name == "prompt":
            texts[-1] += pieces[0]
            for piece in pieces[1:]:
                texts.append(piece)
    return texts


def media_parts(encs: Sequence[Encoded], between: Sequence[list[int]] = ()
                ) -> tuple[list[int], list[Segment], list[int]]:
    """libmtmd encodings in order as (tokens before, segments, tokens after).

    The projector's begin and end markers go with the text around the images, as
    mtmd_helper_eval_chunks decodes them: two llama_decode calls fewer per image, and the first begin
    marker joins the cached prefix. Between two images, one's end marker and the next one's begin
    marker are one token run, as libmtmd tokenizes the (empty) text between two media markers;
    `between[k]`, when given, is the text's tokens between image k and k + 1, in that run."""
    head: list[int] = []
    middle: list[Segment] = []
    tail: list[int] = []
    for k, enc in enumerate(encs):
        if not isinstance(enc, MediaEncoded):
            raise InferenceError("this bundle's images are encoded by libmtmd: use Inspector.encode()")
        parts = list(enc.parts)
        begin: list[int] = []
        end: list[int] = []
        if parts and isinstance(first := parts[0], list):
            begin, parts = first, parts[1:]
        if parts and isinstance(last := parts[-1], list):
            end, parts = last, parts[:-1]
        if k == 0:
            head = begin
        elif tail or begin or (k <= len(between) and between[k - 1]):
            middle.append(tail + (list(between[k - 1]) if k <= len(between) else []) + begin)
        middle.extend(parts)
        tail = end
    return head, middle, tail


class PromptBuilder:
    """The prompts of one bundle over its language model; `media`: its images are libmtmd's."""

    def __init__(self, bundle: Bundle, language: LanguageModel, token_cache_bytes: int, media: bool) -> None:
        self.bundle, self.language, self.media = bundle, language, media
        self.token_cache = TokenCache(token_cache_bytes)
        self.max_prompt_bytes = language.n_ctx * language.max_token_bytes
        self.image_token = -1
        m = bundle.manifest
        if isinstance(m, Manifest) and m.vision.layout is not None:
            ids = language.tokenize(m.vision.layout.image_token)
            if len(ids) != 1:
                raise BundleError(f"{bundle.root / 'bundle.yaml'}: vision.layout.image_token "
                                  f"{m.vision.layout.image_token!r} is not one token of the language model")
            self.image_token = ids[0]

    def sequence(self, prompt: str, enc: Encoded | Sequence[Encoded] | None, system: str | None = None,
                 field: str = "messages", image_at: Sequence[int] = ()) -> tuple[list[int], ImagePart, list[int]]:
        """(prefix, image part, suffix) of one inspection: the prompt template with the image in place.

        Bundles with an image token (exported models) tokenize the whole prompt with the image
        expanded to image tokens, as the model's own processor does, then put an embedding at each
        image token; the tokens before the first one are the cached prefix. Several encodings (a
        GGUF + mmproj bundle only) go at the image slot in order, as libmtmd lays out one media
        marker per image there; with `image_at` (one offset into `prompt` per encoding, a chat whose
        images sit among its text) each goes at its offset instead, as llama.cpp's server places a
        media marker where its part was.
        """
        encs = [] if enc is None else [enc] if isinstance(enc, Encoded) else list(enc)
        if len(encs) > 1 and not self.media:
            raise InputError(f"{field}: this model ({self.bundle.kind} bundle) takes one image per request; "
                             "several images need a GGUF + mmproj bundle (docs/models.md)", field=field)
        m = self.bundle.manifest
        p = m.prompt
        layout = m.vision.layout if isinstance(m, Manifest) else None
        if layout is None:
            before, after = around_image(p.template, p.system if system is None else system, prompt)
            prefix = self.tokenize(before, field)
            image: ImagePart = encs[0].embeds if encs else None
            if self.media:  # the GGUF's own BOS (llama.cpp adds it where the vocabulary asks)
                if encs and len(image_at) == len(encs):
                    texts = slot_texts(p.template, p.system if system is None else system, prompt, image_at)
                    head, parts, tail = media_parts(encs, [self.tokenize(t, field) for t in texts[1:-1]])
                    return (self.language.with_bos(self.tokenize(texts[0], field)) + head, parts,
                            tail + self.tokenize(texts[-1], field))
                prefix = self.language.with_bos(prefix)
                if encs:
                    head, parts, tail = media_parts(encs)
                    return prefix + head, parts, tail + self.tokenize(after, field)
            return prefix, image, self.tokenize(after, field)
        assert isinstance(m, Manifest)
        first = encs[0] if encs else None
        image_text = "" if first is None else image_prompt(layout, m.vision.image_tokens, first.grid)
        ids = self.tokenize(
            p.template.format(system=p.system if system is None else system, image=image_text, prompt=prompt),
            field)
        if first is None:
            return ids, None, []
        return split_at_image_tokens(ids, self.image_token, first.embeds)

    def program_sequence(self, program: LoadedProgram | None, prompt: str, enc: Encoded, field: str = "prompt"
                         ) -> tuple[Head, ImagePart, list[int]]:
        """A frame (or clip) as a prompt under its program (references before the frame, all of it up
        to the frame one shared `Prefix`), or the plain layout of `sequence`."""
        encs = enc.frames if isinstance(enc, ClipEncoded) else [enc]  # a clip: its frames, oldest first
        if program is None or not program.references:
            return self.sequence(prompt, encs, field=field)
        p = self.bundle.manifest.prompt
        before, after = around_image(p.template, p.system, prompt)
        begin, parts, end = media_parts(encs)
        prefix = program.prefix(before, begin, lambda text: self.tokenize(text, field), self.language.with_bos,
                                media_parts)
        return prefix, parts, end + self.tokenize(after, field)

    def tokenize(self, text: str, field: str = "messages") -> list[int]:
        """The same prompt texts come back every frame (one per question and tile grid): tokenize once.

        A text too long to fit the context is refused before it is tokenized (InputError naming
        `field`): no token can hold more than `max_token_bytes` bytes, so a longer text cannot fit."""
        ids = self.token_cache.get(text)
        if ids is None:
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > self.max_prompt_bytes:
                raise InputError(f"{field}: the prompt is {size} bytes; the model's context of "
                                 f"{self.language.n_ctx} tokens holds at most {self.max_prompt_bytes}",
                                 field=field)
            ids = self.language.tokenize(text)
            self.token_cache.put(text, ids)
        return list(ids)

    def prompt_parts(self, prompt: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the image for this question (bundles without an image layout)."""
        m = self.bundle.manifest
        if isinstance(m, Manifest) and m.vision.layout is not None:
            raise InferenceError("this bundle lays the image out with tokens: use Inspector.sequence()")
        prefix, _, suffix = self.sequence(prompt, None)
        return prefix, suffix

    def check_images_fit(self, job: ChatJob, enc: Encoded | None, image_tokens: Callable[[np.ndarray], int]) -> None:
        """InputError naming `messages` before any further image is encoded when the images' tokens
        (`image_tokens` counts them from the sizes) and the text's alone fill the context: the model's
        own check would refuse the prompt only after every image went through the projector."""
        pending = ([job.image] if enc is None and job.image is not None else []) + list(job.more_images)
        images = (0 if enc is None else len(enc.embeds)) + sum(image_tokens(i) for i in pending)
        text = len(self.tokenize(job.prompt)) + len(self.tokenize(job.system or ""))
        if images + text >= self.language.n_ctx:
            raise InputError(f"messages: the request's {len(pending) + (enc is not None)} images make {images} "
                             f"image tokens and its text at least {text}; the context holds {self.language.n_ctx}",
                             field="messages")

"""A real byte-level BPE tokenizer (GPT-2 style), trained deterministically on a small corpus.

llama.cpp loads it as `tokenizer.ggml.model = "gpt2"`: every byte has a token, so any text
tokenizes, and the merges make common inspection words and JSON punctuation single tokens.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

# Special tokens of the ChatML-style template the demo bundle uses; `<image>`…`</image>` wrap the
# image embeddings in the prompt, as most VLMs mark their image block.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "</image>"]

# GPT-2's pre-tokenizer pattern, written for the stdlib `re` (no \p classes there).
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


@dataclass(frozen=True)
class Tokenizer:
    tokens: list[str]
    merges: list[str]
    special: dict[str, int]


def train_bpe(corpus: str, n_merges: int) -> Tokenizer:
    """Learn `n_merges` merges from `corpus`; ties break on the pair's text so output is stable."""
    byte_char = bytes_to_unicode()
    words = Counter(
        tuple(byte_char[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(corpus)
    )
    vocab = [byte_char[b] for b in range(256)]
    known = set(vocab)
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        (left, right), _ = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        merged = left + right
        merges.append(f"{left} {right}")
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        merged_words: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            merged_words[_merge_word(word, left, right)] += count
        words = merged_words
    special = {}
    for name in SPECIAL_TOKENS:
        special[name] = len(vocab)
        vocab.append(name)
    return Tokenizer(tokens=vocab, merges=merges, special=special)


def _merge_word(word: tuple[str, ...], left: str, right: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(left + right)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)

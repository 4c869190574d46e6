"""Moved to `edge_runtime.llm.constraint`; kept so old imports keep working."""

from .llm.constraint import GuidedPicker, VocabTokenizer, lark_for, tokenizer_for

__all__ = ["GuidedPicker", "VocabTokenizer", "lark_for", "tokenizer_for"]

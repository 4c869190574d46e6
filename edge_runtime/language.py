"""The language model's public face: `edge_runtime.llm` holds the implementation (see its
package docstring for the layers); these names are what the rest of the daemon imports."""

from __future__ import annotations

from .llm.feed import Generation, ImagePart, image_segments
from .llm.model import LanguageModel
from .llm.picker import GREEDY, Candidates, Sampling, TokenPicker

__all__ = ["GREEDY", "Candidates", "Generation", "ImagePart", "LanguageModel", "Sampling", "TokenPicker",
           "image_segments"]

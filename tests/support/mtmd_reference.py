"""libmtmd's own path on a whole prompt, the reference our own batches are compared with."""

from __future__ import annotations

import numpy as np

from edge_runtime.inference.inspector import Inspector


def helper_logits(ins: Inspector, images: list[np.ndarray], question: str) -> np.ndarray:
    """The first-token logits of the bundle's prompt with one media marker per image at the image slot,
    in order, through mtmd_helper_eval_chunks (the KV cleared before and after)."""
    assert ins.mtmd is not None
    p = ins.bundle.manifest.prompt
    text = p.template.format(system=p.system, image=ins.mtmd.marker * len(images), prompt=question)
    return text_logits(ins, images, text)


def text_logits(ins: Inspector, images: list[np.ndarray], text: str) -> np.ndarray:
    """The first-token logits of a whole prompt text holding one media marker per image, in order, through
    mtmd_helper_eval_chunks (the KV cleared before and after)."""
    assert ins.mtmd is not None
    lm = ins.language
    lm.forget_prefix(clear=True)
    with ins.mtmd.tokenize(text, [img[:, :, ::-1].copy() for img in images], add_special=True) as chunks:
        ins.mtmd.eval_chunks(lm.ctx, chunks, 0, 0, lm.n_batch)
    lm.forget_prefix(clear=True)
    return lm.ctx.logits_ith(-1).copy()

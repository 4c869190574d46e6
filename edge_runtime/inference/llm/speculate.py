"""A sequence running alone, greedy, on a model with a draft (draft.py) speculates: the draft's guesses
go into the step's batch after the row's own tokens, with logits for each, and the picks that match a
guess are taken from those rows without a step of their own.
"""

from __future__ import annotations

from edge_runtime.inference.llm.draft import Drafter
from edge_runtime.inference.llm.feed import Feed, Prefix, image_segments
from edge_runtime.inference.llm.handles import Context
from edge_runtime.inference.llm.sequence import Running


def speculate(seq: Running, room: int, drafter: Drafter | None, feed: Feed, ctx: Context, n_batch: int,
              fast_forward: bool) -> bool:
    """One step of a sequence running alone, with the draft's guesses after its own tokens; False
    when it drafts nothing (sampled, no draft, paused, or no room): then the plain step runs.
    Each pick is the one the plain step would make, from the row after the same tokens: where it
    equals the next guess, that guess's row holds the logits of the pick after it."""
    p = seq.prompt
    if drafter is None or p.sampling.temperature > 0:
        return False
    n = min(drafter.length.take(), p.max_tokens - len(seq.ids) - 1, n_batch - len(seq.todo))
    if n <= 0:
        return False
    try:
        # A Prefix holding images goes to the draft as segments (it keeps no KV of its own for it).
        head, segs = (([], [*p.prefix.segments, *image_segments(p.image)]) if isinstance(p.prefix, Prefix)
                      else (p.prefix, image_segments(p.image)))
        drafts = drafter.propose(seq, (head, segs, p.suffix), seq.ids, n, seq.picker)
    except Exception:  # noqa: BLE001 - the draft's own failure (its context full, a decode error) is no
        # reason to fail the answer: this step runs without guesses, the draft starts over next time
        drafter.failed()
        return False
    finally:
        seq.picker.forget_guesses()
    if not drafts:
        return False
    batch = feed.tokens.struct
    todo, seq.todo = seq.todo, []
    for i, tok in enumerate(todo + drafts):
        batch.token[i] = tok
        batch.pos[i] = seq.pos + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq.slot
        batch.logits[i] = int(i >= len(todo) - 1)
    batch.n_tokens = len(todo) + len(drafts)
    seq.shared += 1
    feed.decode(ctx, batch)
    first = seq.pos + len(todo)  # the first guess's position
    row = len(todo) - 1  # the row whose logits give the next pick
    seq.pending = seq.picker.next_token(ctx, row)
    taken = 0
    while taken < len(drafts) and seq.pending[0] == drafts[taken]:
        taken += 1
        finish = seq.advance(room, fast_forward)
        # The tokens the grammar forces after the pick are decoded already where they are guesses too.
        forced = seq.todo[1:]
        ahead = drafts[taken:taken + len(forced)]
        same = next((k for k, (a, b) in enumerate(zip(forced[:len(ahead)], ahead, strict=True)) if a != b),
                    len(ahead))
        taken += same
        seq.todo = forced[same:]
        if finish is not None:
            seq.ended = finish
            break
        if seq.todo:
            break  # a forced token the draft did not guess: decoded by the next step
        seq.pending = seq.picker.next_token(ctx, row + taken)
    if taken < len(drafts):  # the cells of the guesses not taken
        ctx.memory_seq_rm(seq.slot, first + taken, -1)
    seq.pos = first + taken
    seq.drafted += len(drafts)
    seq.draft_accepted += taken
    drafter.length.update(len(drafts), taken)
    return True

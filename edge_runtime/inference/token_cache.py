"""A least-recently-used cache of tokenized texts, bounded by the bytes it holds, not its entry count.

Six distinct 10 MB prompts in a 64-entry cache kept 1.27 GB alive (issue 14 item 8)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class TokenCache:
    """text -> token ids; holds at most `budget` bytes (text + ids); larger entries are not kept."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.size = 0
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()

    @staticmethod
    def cost(text: str, ids: np.ndarray) -> int:
        return len(text) * 4 + 64 + ids.nbytes  # a str is at most 4 bytes a character

    def get(self, text: str) -> list[int] | None:
        ids = self._items.get(text)
        if ids is None:
            return None
        self._items.move_to_end(text)
        return list(ids.tolist())

    def put(self, text: str, ids: list[int]) -> None:
        arr = np.asarray(ids, dtype=np.int32)
        cost = self.cost(text, arr)
        if cost > self.budget // 4 or text in self._items:
            return  # one-off giants would evict every prompt that repeats
        self._items[text] = arr
        self.size += cost
        while self.size > self.budget:
            old, old_ids = self._items.popitem(last=False)
            self.size -= self.cost(old, old_ids)

    def __len__(self) -> int:
        return len(self._items)

"""Prompt-lookup drafting (n-gram): no model, only the request's own tokens.

The last n tokens (n from `max_n` down to `min_n`) are looked up in the request's prompt and output;
at the latest earlier occurrence, the tokens that followed it are the draft. Coding agents rewrite
code that is already in the prompt, so the continuation of a matched n-gram is often what comes next.
"""

from __future__ import annotations

import numpy as np


class NgramDrafter:
    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest matching suffix
        of `tokens` (an empty list: no match, or k < 1)."""
        if k < 1 or len(tokens) < self.min_n + 1:
            return []
        ids = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            suffix = ids[-n:]
            # windows starting at 0..len-n-1: every occurrence that ends before the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return ids[start : start + k].tolist()
        return []

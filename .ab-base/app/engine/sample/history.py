"""A request's token history in the form the penalties read it, kept up to date one step at a time.

Repetition penalties need the distinct tokens of prompt and output, frequency and presence
penalties each output token's count. Rebuilding those with `np.unique` over the whole history
every step cost ~5-20 ms per penalised sequence at a 32k-token context; folding in only the
tokens sampled since the last step costs microseconds. The history only grows within a request
(a device-sampled placeholder stands last for one step and is not folded in); if it ever
shrinks or the prompt changes, it is rebuilt from scratch.
"""

from __future__ import annotations

import numpy as np

from app.engine.request import PLACEHOLDER, Request


class _GrowingIds:
    """Distinct token ids in first-seen order, with a count each, in arrays that grow by doubling."""

    def __init__(self, ids: np.ndarray, counts: np.ndarray) -> None:
        self._index = {int(t): i for i, t in enumerate(ids.tolist())}
        size = max(16, 2 * len(ids))
        self._ids = np.zeros(size, dtype=np.int64)
        self._counts = np.zeros(size, dtype=np.int64)
        self._ids[: len(ids)], self._counts[: len(ids)] = ids, counts

    @classmethod
    def of(cls, tokens: list[int]) -> _GrowingIds:
        ids, counts = np.unique(np.asarray(tokens, dtype=np.int64), return_counts=True)
        return cls(ids, counts)

    def add(self, token: int) -> None:
        position = self._index.get(token)
        if position is None:
            position = self._index[token] = len(self._index)
            if position == len(self._ids):
                self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
                self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._ids[position] = token
        self._counts[position] += 1

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: len(self._index)]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[: len(self._index)]


class TokenHistory:
    """The distinct tokens of prompt + output (`seen`) and the output tokens with their counts."""

    def __init__(self, request: Request) -> None:
        self._prompt_length = len(request.prompt_token_ids)
        self._seen = _GrowingIds.of(request.prompt_token_ids)
        self._outputs = _GrowingIds.of([])
        self._folded = 0  # output tokens folded in so far

    @classmethod
    def of(cls, request: Request) -> TokenHistory:
        """The request's history, brought up to date (made on first use, then kept on the request)."""
        history = request.token_history
        if history is None or not history._fits(request):
            history = request.token_history = cls(request)
        history._catch_up(request.output_token_ids)
        return history

    def _fits(self, request: Request) -> bool:
        return self._prompt_length == len(request.prompt_token_ids) and self._folded <= len(request.output_token_ids)

    def _catch_up(self, outputs: list[int]) -> None:
        end = len(outputs) - (1 if outputs and outputs[-1] == PLACEHOLDER else 0)
        for token in outputs[self._folded : end]:
            self._seen.add(token)
            self._outputs.add(token)
        self._folded = max(self._folded, end)

    @property
    def seen(self) -> np.ndarray:
        """Each distinct token of prompt and output once (in no particular order)."""
        return self._seen.ids

    @property
    def output_ids(self) -> np.ndarray:
        return self._outputs.ids

    @property
    def output_counts(self) -> np.ndarray:
        return self._outputs.counts

"""The MTP drafter (`--speculative mtp`): the model's own multi-token-prediction head (models/mtp.py)
proposes k tokens greedily from the target's hidden states; the target verifies them in one step as it
does other drafts (spec/verify.py).

The head's row at position i reads the target's final hidden state at i and the token at i + 1, and
predicts the token at i + 2; its attention reads its own K/V at positions <= i. So the head must see
every position the target computes, one token late: the engine hands it each step's hidden states
(`observe`), and a proposal first runs the head over the positions seen since the last one
(`catch up`: their tokens are known by then), whose last row gives the first draft; each further draft
chains the head on its own output at the next position, as vLLM's and SGLang's MTP proposers do.

The head's K/V live in one more paged KV array beside the model's, addressed through the request's own
block table (a block's MTP K/V are those of the request that computed the block, shared with it by the
prefix cache, as its target K/V are); chained drafts write past the computed tokens, in the request's
blocks or in the null block, and the next catch-up overwrites them with the real tokens'. Positions
the target did not compute (a prefix-cache hit) keep the K/V their block had: the drafts may be worse
there, never the output. What is kept per request is the hidden states since its last proposal
(positions past what verification kept are cut off before a catch-up); forgotten when it ends.

On CUDA the target's steps replay the verify graphs, which put out the hidden states too
(worker/verify_graphs.py), and each chained draft step replays a graph of the head (worker/mtp_graph.py);
its argmax is still read back per draft (the next step's input: keeping it on the device would chain
the k steps in one graph). The catch-up runs eagerly: it covers however many positions verification kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from app.engine.core.scheduler import ScheduledChunk
from app.engine.models.mtp import MtpHead
from app.engine.request import Request


class MtpDrafter:
    def __init__(
        self, head: MtpHead, runner: Any, cache: tuple[Any, ...], vocab_size: int, max_rows: int = 2048
    ) -> None:
        self.head, self.runner, self.cache = head, runner, cache
        self.backend = runner.backend
        self.vocab_size = vocab_size
        self.max_rows = max_rows  # a catch-up runs in pieces of at most this many positions (a long prompt's)
        self._seen: dict[str, tuple[int, Any]] = {}  # request id -> (first position, target hidden rows)
        self.step_graph: Any = None  # MtpStepGraph (worker/mtp_graph.py), set by the engine on CUDA

    def observe(self, chunks: list[Any], hidden: Any, may_draft: Callable[[Request], bool]) -> None:
        """A step's final hidden states `[T, hidden]`, all rows of `chunks` in order, kept for the
        requests that may draft (a verify chunk's rows past what verification keeps are cut off at the
        next proposal)."""
        xp, at = self.backend.xp, 0
        for chunk in chunks:
            rows, start = hidden[at : at + chunk.num_tokens], chunk.start
            at += chunk.num_tokens
            rid = chunk.request.request_id
            if not may_draft(chunk.request):
                self._seen.pop(rid, None)
                continue
            seen = self._seen.get(rid)
            if seen is not None and seen[0] <= start <= seen[0] + seen[1].shape[0]:  # continues (or rewrites) it
                first, kept = seen
                rows, start = xp.concatenate([kept[: start - first], rows]), first
            self._seen[rid] = (start, rows)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        raise TypeError("the MTP drafter drafts from a request's hidden states: call propose_for(request, k)")

    def propose_for(self, request: Request, k: int) -> list[int]:
        """Up to `k` tokens after the request's tokens, drafted greedily by the MTP head (none where the
        hidden state of its last computed position was not seen)."""
        seen = self._seen.get(request.request_id)
        computed = request.num_computed_tokens
        if k < 1 or seen is None or request.num_tokens != computed + 1:
            return []
        first, rows = seen
        if not first < computed <= first + rows.shape[0]:
            return []
        rows = rows[: computed - first]
        self._seen[request.request_id] = (computed, rows[:0])
        tokens = request.all_token_ids[first + 1 : computed + 1]
        for at in range(0, len(tokens), self.max_rows):  # in pieces: each reads the K/V the ones before wrote
            hidden = self._run(request, first + at, tokens[at : at + self.max_rows], rows[at : at + self.max_rows])
        hidden = hidden[-1:]
        logits = self.head.logits(hidden)
        drafts: list[int] = []
        for j in range(k):
            token = int(np.argmax(self.backend.to_host(logits)[0]))
            if token >= self.vocab_size:
                break
            drafts.append(token)
            if j + 1 < k:
                hidden, logits = self._step(request, computed + j, token, hidden)
        return drafts

    def forget(self, request_id: str) -> None:
        self._seen.pop(request_id, None)

    def _step(self, request: Request, position: int, token: int, hidden: Any) -> tuple[Any, Any]:
        """A chained draft step: the head's row and logits for `token` at `position` (a graph replay
        where one was captured)."""
        if self.step_graph is not None:
            return self.step_graph.run(token, position, request.block_ids, hidden)
        hidden = self._run(request, position, [token], hidden)
        return hidden, self.head.logits(hidden)

    def _run(self, request: Request, start: int, tokens: list[int], hidden: Any) -> Any:
        """The head over `tokens` at positions `start..`, each with the hidden state before it."""
        meta, _ = self.runner.metadata([ScheduledChunk(request, start, len(tokens), True)])
        ids = self.backend.from_host(np.asarray(tokens, dtype=np.int32))
        return self.head(ids, hidden, meta, self.cache)

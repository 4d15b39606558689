"""Batched token sampling on the host (numpy): the reference the GPU sampler must match.

Order, as vLLM: logprobs from the raw logits; a grammar's mask (tokens it does not allow
next become -inf: sample/grammar.py); penalties (repetition, HF style, over prompt and
output; frequency and presence, OpenAI style, over the output); `min_tokens` (EOS and stop
token ids banned until enough tokens were generated; not on rows with a grammar, which
decides where its text ends);
temperature; top-k, top-p, min-p; then one draw. Temperature 0 (below 1e-5, in fact,
where dividing would overflow) is greedy argmax, ties going to the lowest id.

Filters are thresholds on logits, so tokens tied with the last kept one are kept too
(except past the widest top-k of the batch, which one partition selects). top-p is
computed on the distribution top-k left; min-p compares each probability with the top
one, a ratio no renormalisation changes, so it is a threshold on logits too. Rows with
top-k do all the rest on their few candidates; a cumulative sum over the whole
vocabulary is never taken, and a full sort only for a top-p nucleus wider than a
quarter of the vocabulary.

Randomness: a request with a `seed` has its own generator (its tokens depend only on
its seed and its logits, never on the rest of the batch); the others share one
generator seeded with `default_seed`. Each sampled row takes one uniform draw,
inverted through the cumulative distribution of the surviving tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.engine.request import Request, TokenLogprob
from app.engine.sample.grammar import GrammarMasks
from app.engine.sample.ops import apply_penalties, apply_token_bitmask, draw_among_top_k, draw_full_width

GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # None where the request asked for no logprobs


@dataclass(frozen=True)
class ReadySample:
    """A launched sample that is already done (the numpy backend has no device to wait for):
    `device_ids` (int32 [rows]) is what the next step reads its token ids from."""

    output: SamplerOutput
    device_ids: np.ndarray

    def resolve(self) -> SamplerOutput:
        return self.output


def penalised(request: Request) -> bool:
    """Whether a row has repetition, frequency or presence penalties: they need its token history."""
    p = request.sampling_params
    return bool(p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty)


def constrained(request: Request) -> bool:
    """Whether a row's tokens must follow a grammar."""
    return request.sampling_params.grammar is not None


def deferrable(request: Request) -> bool:
    """Whether a row's token may stay on the device for a step (core/pipeline.py): not with
    penalties, which need the token history on the host, nor with logprobs, which are read from
    a logits buffer the next step overwrites, nor with a grammar, whose matcher must take each
    token before the next mask."""
    return not penalised(request) and request.sampling_params.logprobs is None and not constrained(request)


def may_verify(request: Request) -> bool:
    """Whether a row may carry drafted tokens (app/engine/spec/): its k+1 positions are then sampled in
    one batch, so nothing may depend on the tokens before each one but the logits: no penalties (token
    history), no grammar (a matcher that takes each token), no min_tokens ban still in force (it lifts
    at a token count), and no images (a request's image spans are placed by position)."""
    return (
        not penalised(request)
        and not constrained(request)
        and request.num_output_tokens >= request.sampling_params.min_tokens
        and not request.images
    )


class Sampler:
    def __init__(
        self, eos_token_ids: frozenset[int], default_seed: int = 0, grammars: GrammarMasks | None = None
    ) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.grammars = grammars  # None: requests with a grammar are refused
        self._shared_rng = np.random.default_rng(default_seed)
        self._seeded_rngs: dict[str, np.random.Generator] = {}

    def start(self, request: Request) -> None:
        """Set up per-request state as a request arrives: its grammar's matcher. ValueError when
        the grammar cannot be served."""
        if constrained(request):
            if self.grammars is None:
                raise ValueError(
                    "this engine cannot enforce grammars (no tokenizer was given to its sampler)"
                )
            self.grammars.start(request)

    def forget(self, request_id: str) -> None:
        """Drop per-request state when a request ends."""
        self._seeded_rngs.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.forget(request_id)

    def launch(self, logits: np.ndarray, requests: Sequence[Request]) -> ReadySample:
        """`sample()` in the launch/resolve shape of the GPU sampler (core/pipeline.py)."""
        out = self.sample(logits, requests)
        return ReadySample(out, np.asarray(out.token_ids, dtype=np.int32))

    def sample(self, logits: np.ndarray, requests: Sequence[Request]) -> SamplerOutput:
        """Pick one token per row; row i of `logits` (float32 [batch, vocab]) is for requests[i]."""
        if logits.ndim != 2 or logits.shape[0] != len(requests):
            raise ValueError(f"logits must be [batch={len(requests)}, vocab], got shape {logits.shape}")
        params = [r.sampling_params for r in requests]
        chosen = np.empty(len(requests), dtype=np.int64)
        raw, logits = logits, self._process(logits, requests)

        greedy = np.array([p.temperature < GREEDY_BELOW for p in params], dtype=bool)
        if greedy.any():
            rows = logits if greedy.all() else logits[greedy]
            chosen[greedy] = np.argmax(rows, axis=1)  # argmax takes the first (lowest id) of ties
        rows = np.flatnonzero(~greedy)
        if rows.size:
            chosen[rows] = self._draw(logits[rows], [requests[i] for i in rows])

        token_ids = chosen.tolist()
        self.advance_grammars(requests, token_ids)
        return SamplerOutput(token_ids, self._logprobs(raw, requests, token_ids))

    def advance_grammars(self, requests: Sequence[Request], token_ids: Sequence[int]) -> None:
        """The constrained rows' matchers take their chosen tokens."""
        rows = [i for i, r in enumerate(requests) if constrained(r)]
        if rows:
            assert self.grammars is not None, "a request with a grammar was not started"
            self.grammars.advance([requests[i] for i in rows], [token_ids[i] for i in rows])

    # --- logit processing ---

    def _process(self, logits: np.ndarray, requests: Sequence[Request]) -> np.ndarray:
        """Grammar masks, penalties and min_tokens bans, on a copy (the raw logits feed the logprobs)."""
        edited: np.ndarray | None = None
        masked = [i for i, r in enumerate(requests) if constrained(r)]
        if masked:
            assert self.grammars is not None, "a request with a grammar was not started"
            edited = np.array(logits, dtype=np.float32)
            rows = edited[masked]
            apply_token_bitmask(rows, self.grammars.masks([requests[i] for i in masked]))
            edited[masked] = rows
        for row, request in enumerate(requests):
            banned = self.banned(request)
            with_penalties = penalised(request)
            if not (with_penalties or banned):
                continue
            if edited is None:
                edited = np.array(logits, dtype=np.float32)
            if with_penalties:
                apply_penalties(edited[row], request)
            if banned:
                # an id outside the vocabulary can never be drawn anyway: nothing to ban
                edited[row, [t for t in banned if 0 <= t < logits.shape[1]]] = -np.inf
        return logits if edited is None else edited

    def banned(self, request: Request) -> list[int]:
        p = request.sampling_params
        if request.num_output_tokens >= p.min_tokens or constrained(request):
            return []
        return sorted(self.eos_token_ids.union(p.stop_token_ids))

    # --- drawing ---

    def _draw(self, logits: np.ndarray, requests: list[Request]) -> np.ndarray:
        """Sample one token per row. `logits` is the caller's private copy: scaled in place."""
        params = [r.sampling_params for r in requests]
        uniforms = self._uniforms(requests)  # one per row, before any grouping: seeds stay batch-independent
        scaled = logits
        scaled /= np.array([p.temperature for p in params], dtype=scaled.dtype)[:, None]
        vocab = scaled.shape[1]
        top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
        top_p = np.array([p.top_p for p in params])
        min_p = np.array([p.min_p for p in params])
        row_max = scaled.max(axis=1)
        if not np.isfinite(row_max).all():
            bad = int(np.flatnonzero(~np.isfinite(row_max))[0])
            raise ValueError(f"logits for request {requests[bad].request_id!r} have no finite value")
        with np.errstate(divide="ignore"):
            min_p_cut = row_max + np.log(min_p)  # -inf where min_p is off

        chosen = np.empty(len(requests), dtype=np.int64)
        with_k = top_k < vocab
        if with_k.any():
            chosen[with_k] = draw_among_top_k(
                scaled[with_k], top_k[with_k], top_p[with_k], min_p_cut[with_k], uniforms[with_k]
            )
        rest = np.flatnonzero(~with_k)
        if rest.size:
            rows = scaled[rest] if rest.size < len(requests) else scaled
            chosen[rest] = draw_full_width(rows, row_max[rest], top_p[rest], min_p_cut[rest], uniforms[rest])
        return chosen

    def _uniforms(self, requests: list[Request]) -> np.ndarray:
        draws = np.empty(len(requests))
        for i, request in enumerate(requests):
            seed = request.sampling_params.seed
            if seed is None:
                rng = self._shared_rng
            else:
                rng = self._seeded_rngs.get(request.request_id)
                if rng is None:
                    rng = self._seeded_rngs[request.request_id] = np.random.default_rng(seed)
            draws[i] = rng.random()
        return draws

    # --- logprobs ---

    def _logprobs(
        self, raw: np.ndarray, requests: Sequence[Request], token_ids: list[int]
    ) -> list[TokenLogprob | None]:
        """The chosen token's and the top-N log-probabilities under the raw model logits
        (before penalties and temperature: the model's own distribution)."""
        result: list[TokenLogprob | None] = [None] * len(requests)
        rows = [i for i, r in enumerate(requests) if r.sampling_params.logprobs is not None]
        if not rows:
            return result
        values = raw[rows]
        row_max = values.max(axis=1, keepdims=True)
        log_total = row_max[:, 0] + np.log(np.exp(values - row_max).sum(axis=1, dtype=np.float64))
        chosen = values[np.arange(len(rows)), [token_ids[i] for i in rows]] - log_total
        counts = [requests[i].sampling_params.logprobs or 0 for i in rows]
        widest = min(max(counts), values.shape[1])
        top_ids = np.empty((len(rows), 0), dtype=np.int64)
        if widest:
            vocab = values.shape[1]
            top_ids = np.argpartition(values, vocab - widest, axis=1)[:, vocab - widest :]
            top_values = np.take_along_axis(values, top_ids, axis=1)
            order = np.lexsort((top_ids, -top_values), axis=1)  # best first; ties: lowest id first
            top_ids = np.take_along_axis(top_ids, order, axis=1)
        top_logprobs = np.take_along_axis(values, top_ids, axis=1) - log_total[:, None]
        for j, i in enumerate(rows):
            top = tuple(
                zip(top_ids[j, : counts[j]].tolist(), top_logprobs[j, : counts[j]].tolist(), strict=True)
            )
            result[i] = TokenLogprob(token_ids[i], float(chosen[j]), top)
        return result

"""Run a built model over known token ids through the engine's real paged-KV path; logits at every position.

The engine only ever asks for the logits of a chunk's last token; correctness tests need them
at every position, computed the way the engine computes them. This harness builds each step's
batch with the engine's own `ModelRunner.prepare` (block tables, slot mapping, positions),
runs `model.forward`, and keeps the logits of every row. Steps are scheduled in several ways
so that bugs which one way hides show up in another:

- "prefill": all tokens in one step;
- "chunked": chunks of 13, 11 and the rest (chunk edges inside KV blocks);
- "decode": a 5-token prompt, then one token per step, the later tokens arriving as the
  request's output tokens, as sampled tokens do;
- "batched": the same steps as "decode" for the target sequence, sharing every step with a
  second request in chunked prefill and then decode, so query offsets and block tables of
  several sequences are exercised.

Blocks are small (4 tokens: every run crosses many), the block ids are a shuffled,
non-contiguous sample of a larger pool, and the cache starts full of finite garbage rather
than zeros, as reused blocks are in the engine: reading a slot the sequence never wrote
changes the logits instead of silently adding zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.core.scheduler import ScheduledChunk
from app.engine.request import Request
from app.engine.sampling_params import SamplingParams
from app.engine.worker.runner import ModelRunner

MODES = ("prefill", "chunked", "decode", "batched")
BLOCK_SIZE = 4
CHUNKS = (13, 11)  # then the rest
DECODE_PROMPT = 5  # one whole block and one token of the next
COMPANION_TOKENS, COMPANION_PROMPT = 23, 15  # the "batched" mode's second request: 15 prompt, 8 decoded


def run_logits(
    model: Any, backend: Any, token_ids: Sequence[int], mode: str, block_size: int = BLOCK_SIZE, seed: int = 0
) -> np.ndarray:
    """Logits `[len(token_ids), vocab]` (float32) of `model` over `token_ids`, run as `mode` says."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    tokens = [int(t) for t in token_ids]
    rng = np.random.default_rng(seed)
    other = (
        [int(t) for t in rng.integers(0, model.config.vocab_size, COMPANION_TOKENS)]
        if mode == "batched"
        else []
    )
    blocks_needed = -(-len(tokens) // block_size) + -(-len(other) // block_size)
    num_blocks = 3 * blocks_needed + 1  # block 0 is the engine's null block: never handed out
    pool = rng.permutation(np.arange(1, num_blocks))
    runner = ModelRunner(
        model, backend, _garbage_kv_caches(model, backend, num_blocks, block_size, rng), block_size
    )

    target = _request("target", tokens, DECODE_PROMPT if mode in ("decode", "batched") else len(tokens))
    target.block_ids = [int(b) for b in pool[: -(-len(tokens) // block_size)]]
    if mode == "prefill":
        return _step(runner, [_chunk(target, len(tokens))])[0]
    if mode == "chunked":
        sizes = [*CHUNKS, len(tokens) - sum(CHUNKS)]
        return np.concatenate([_step(runner, [_chunk(target, n)])[0] for n in sizes])

    companion = None
    if mode == "batched":
        companion = _request("companion", other, COMPANION_PROMPT)
        companion.block_ids = [int(b) for b in pool[len(target.block_ids) : blocks_needed]]
    rows = []
    while target.num_computed_tokens < len(tokens):
        _feed(target, tokens)
        chunks = [_chunk(target, target.num_pending_tokens)]
        if companion is not None and companion.num_computed_tokens < len(other):
            _feed(companion, other)
            # Its prompt goes in chunks of 6 and 3, then it decodes; it sits before and after the target.
            chunk = _chunk(companion, min(companion.num_pending_tokens, 6))
            chunks = [chunk, *chunks] if len(rows) % 2 else [*chunks, chunk]
        outputs = _step(runner, chunks)
        rows.append(next(out for c, out in zip(chunks, outputs, strict=True) if c.request is target))
    return np.concatenate(rows)


def _feed(request: Request, tokens: list[int]) -> None:
    """Once all known tokens have KV, the next one arrives as an output token, as a sampled one would."""
    if request.num_computed_tokens == request.num_tokens and request.num_tokens < len(tokens):
        request.output_token_ids.append(tokens[request.num_tokens])


def _request(request_id: str, tokens: list[int], prompt_len: int) -> Request:
    return Request(request_id, tokens[:prompt_len], SamplingParams(temperature=0.0))


def _chunk(request: Request, num_tokens: int) -> ScheduledChunk:
    start = request.num_computed_tokens
    return ScheduledChunk(request, start, num_tokens, samples=start + num_tokens == request.num_tokens)


def _step(runner: ModelRunner, chunks: list[ScheduledChunk]) -> list[np.ndarray]:
    """One engine step; logits of every token of each chunk, in chunk order."""
    token_ids, meta, _ = runner.prepare(chunks)
    backend = runner.backend
    hidden = runner.model.forward(backend.from_host(token_ids), meta, runner.kv_caches)
    logits = np.asarray(backend.to_host(runner.model.logits(hidden)), dtype=np.float32)
    for chunk in chunks:
        chunk.request.num_computed_tokens += chunk.num_tokens
    starts = meta.host_query_start_loc
    return [logits[starts[i] : starts[i + 1]] for i in range(len(chunks))]


def _garbage_kv_caches(model: Any, backend: Any, num_blocks: int, block_size: int, rng: np.random.Generator):
    """Each layer's cache: its own (K, V) where it owns one (shaped as that layer's heads), the cache of
    the layer it reads where it shares another's (Gemma 4), None where it has no attention."""
    cfg = model.config
    caches: list[Any] = []
    for layer in range(cfg.num_layers):
        shape = cfg.kv_shape(layer)
        if shape is None:
            source = cfg.kv_source(layer)
            caches.append(caches[source] if source != layer else None)
            continue
        k_cache, v_cache = backend.alloc_kv_cache(num_blocks, block_size, *shape)
        for cache in (k_cache, v_cache):
            cache[...] = backend.from_host(rng.normal(0.0, 10.0, cache.shape).astype(np.float32))
        caches.append((k_cache, v_cache))
    return caches

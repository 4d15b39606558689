"""Paged attention written once over an array module (numpy or CuPy): the numpy backend's
`attention`, and the path any backend takes for a step whose prompt holds images.

Besides the causal mask (and the sliding window over it), a sequence may name spans of
absolute positions `[start, end)` whose tokens see each other both ways: Gemma 3's image
soft tokens attend bidirectionally within their image (transformers' blockwise overlay,
OR-ed into the causal mask before the window is AND-ed on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.engine.backend.base import AttentionMetadata

Spans = Sequence[tuple[int, int]]


def _read_blocks(cache: Any, table: Any, f32: Any) -> Any:
    """Blocks of a KV cache as float32: dequantized by an FP8 cache (fp8_kv.Fp8KvCache.read), widened
    from float16 otherwise."""
    read = getattr(cache, "read", None)
    return read(table) if read is not None else cache[table].astype(f32, copy=False)


def paged_attention(
    xp: Any,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    spans: Sequence[Spans] | None = None,
    sinks: Any | None = None,
) -> Any:
    """`Backend.attention`'s semantics, plus `spans[i]`: sequence i's bidirectional spans, and
    `sinks [n_heads]`: one more logit per head in the softmax's denominator only (GPT-OSS)."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    block_size = k_cache.shape[1]
    starts = meta.host_query_start_loc if meta.host_query_start_loc is not None else meta.query_start_loc
    seq_lens = meta.host_seq_lens if meta.host_seq_lens is not None else meta.seq_lens
    f32 = xp.float32
    out = xp.empty(q.shape, dtype=q.dtype)
    for i in range(len(seq_lens)):
        q_start, q_end, ctx = int(starts[i]), int(starts[i + 1]), int(seq_lens[i])
        n_q = q_end - q_start
        n_blocks = -(-ctx // block_size)
        table = meta.block_tables[i, :n_blocks]
        keys = _read_blocks(k_cache, table, f32).reshape(-1, n_kv, head_dim)[:ctx]  # [ctx, n_kv, d]
        values = _read_blocks(v_cache, table, f32).reshape(-1, n_kv, head_dim)[:ctx]
        # [n_kv, group * n_q, d]: the query heads that share one KV head, stacked as rows
        qs = (
            q[q_start:q_end].astype(f32, copy=False).reshape(n_q, n_kv, group, head_dim).transpose(1, 2, 0, 3)
        )
        qs = qs.reshape(n_kv, group * n_q, head_dim)
        scores = xp.matmul(qs, keys.transpose(1, 2, 0)) * f32(scale)  # [n_kv, group*n_q, ctx]
        if softcap is not None:
            scores = f32(softcap) * xp.tanh(scores / f32(softcap))
        q_pos = xp.arange(ctx - n_q, ctx)
        k_pos = xp.arange(ctx)
        visible = k_pos[None, :] <= q_pos[:, None]
        for start, end in spans[i] if spans is not None else ():
            visible |= ((q_pos >= start) & (q_pos < end))[:, None] & ((k_pos >= start) & (k_pos < end))[
                None, :
            ]
        if sliding_window is not None:
            visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
        mask = xp.tile(visible, (group, 1))  # rows ordered (group, n_q)
        scores = xp.where(mask[None], scores, f32(-xp.inf))
        if sinks is None:
            scores -= scores.max(axis=-1, keepdims=True)
            probs = xp.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
        else:  # the sink weighs no value
            sink = xp.repeat(sinks.astype(f32).reshape(n_kv, group, 1), n_q, axis=2).reshape(n_kv, group * n_q, 1)
            top = xp.maximum(scores.max(axis=-1, keepdims=True), sink)
            probs = xp.exp(scores - top)
            probs /= probs.sum(axis=-1, keepdims=True) + xp.exp(sink - top)
        ctx_out = xp.matmul(probs, values.transpose(1, 0, 2))  # [n_kv, group*n_q, d]
        ctx_out = ctx_out.reshape(n_kv, group, n_q, head_dim).transpose(2, 0, 1, 3)
        out[q_start:q_end] = ctx_out.reshape(n_q, n_heads, head_dim)
    return out

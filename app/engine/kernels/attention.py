"""Wrapper of attention.cu: paged causal attention with split-K for long contexts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.kernels.compile import get_kernel
from app.engine.kernels.launch import NULL, cdiv, f32, i32

CHUNK = 256  # keys per pass inside a block (ATTN_CHUNK)
THREADS = 128  # ATTN_WARPS * 32
GROUP_BUCKETS = (1, 2, 4, 8, 16)
HEAD_DIMS = (64, 128, 256)
NO_SPLIT = 1 << 30


@dataclass(frozen=True)
class SplitPlan:
    num_splits: int
    split_len: int  # keys per split


def plan_splits(
    n_tokens: int, n_kv: int, max_seq_len: int, sm_count: int, n_heads: int, head_dim: int
) -> SplitPlan:
    """Split the context when (token, KV head) blocks alone would leave the GPU idle.

    Aims at about four blocks per multiprocessor, never a split shorter than one chunk,
    and at most 64 MiB of partial sums.
    """
    blocks = n_tokens * n_kv
    if max_seq_len <= CHUNK or blocks >= 2 * sm_count:
        return SplitPlan(1, NO_SPLIT)
    splits = min(cdiv(max_seq_len, CHUNK), cdiv(4 * sm_count, blocks))
    max_by_memory = max(1, (64 << 20) // max(1, n_tokens * n_heads * head_dim * 4))
    splits = max(1, min(splits, max_by_memory))
    if splits == 1:
        return SplitPlan(1, NO_SPLIT)
    split_len = cdiv(cdiv(max_seq_len, splits), 32) * 32
    return SplitPlan(cdiv(max_seq_len, split_len), split_len)


def attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    query_start_loc: Any,
    seq_lens: Any,
    block_tables: Any,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    plan: SplitPlan,
    out: Any,
) -> Any:
    """`out [T, n_heads, D]` (float32) for float32 `q [T, n_heads, D]` over float16 paged caches."""
    import cupy

    n_tok, n_heads, head_dim = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention supports head_dim {HEAD_DIMS}, got {head_dim}")
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads do not divide into {n_kv} KV heads")
    group = n_heads // n_kv
    gmax = next((g for g in GROUP_BUCKETS if g >= group), None)
    if gmax is None:
        raise ValueError(f"attention supports up to {GROUP_BUCKETS[-1]} query heads per KV head, got {group}")
    if n_tok == 0:
        return out
    kernel = get_kernel("attention.cu", f"attn_d{head_dim}_g{gmax}", {"ATTN_D": head_dim, "ATTN_G": gmax})
    n_seqs = seq_lens.shape[0]
    if plan.num_splits > 1:
        part_acc = cupy.empty((n_tok, n_heads, plan.num_splits, head_dim), cupy.float32)
        part_m = cupy.empty((n_tok, n_heads, plan.num_splits), cupy.float32)
        part_l = cupy.empty((n_tok, n_heads, plan.num_splits), cupy.float32)
        target = NULL
    else:
        part_acc = part_m = part_l = NULL
        target = out
    args = (
        q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, i32(block_tables.shape[1]), i32(n_seqs),
        i32(n_heads), i32(n_kv), i32(block_size), f32(scale), f32(softcap or 0.0), i32(sliding_window or 0),
        i32(plan.split_len), target, part_acc, part_m, part_l,
    )  # fmt: skip
    kernel((n_tok, n_kv, plan.num_splits), (THREADS,), args)
    if plan.num_splits > 1:
        combine = get_kernel("attention.cu", "attn_combine", {"ATTN_D": head_dim, "ATTN_G": gmax})
        combine(
            (n_tok * n_heads,),
            (min(256, head_dim),),
            (part_acc, part_m, part_l, out, i32(plan.num_splits), i32(head_dim)),
        )
    return out

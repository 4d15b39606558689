"""Wrapper of attention.cu: paged causal attention with split-K for long contexts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.kernels.kv_format import kv_operands
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import NULL, cdiv, f32, i32, launch

CHUNK = 256  # keys per pass inside a block (ATTN_CHUNK)
MIN_SPLIT = 64  # shortest split: below this, the partial sums cost more than the keys
MAX_SPLITS = 128  # at most ATTN_CHUNK: the merge keeps one weight per split in the shared scores
THREADS = 128  # ATTN_WARPS * 32
GROUP_BUCKETS = (1, 2, 4, 8, 16)
HEAD_DIMS = (16, 32, 64, 128, 256, 512)  # attention_decode.cu and attention_prefill.cu have fewer
NO_SPLIT = 1 << 30


# Per (token, KV head) counts of finished splits (attention.cu): zero between launches. Kept
# for the life of the process, since captured CUDA graphs hold their address; a bigger batch
# gets a bigger buffer and the old one stays alive for the graphs that use it.
_counters: dict[int, list[Any]] = {}  # device id -> buffers, the newest last
MIN_COUNTERS = 1 << 16


def split_counters(n: int) -> Any:
    import cupy

    buffers = _counters.setdefault(cupy.cuda.Device().id, [])
    if not buffers or buffers[-1].size < n:
        buffers.append(cupy.zeros(max(n, MIN_COUNTERS), cupy.int32))
    return buffers[-1]


@dataclass(frozen=True)
class SplitPlan:
    num_splits: int
    split_len: int  # keys per split
    min_blocks: int = 1  # register budget of the kernel build: 4 caps it at 128 (see attention.cu)


def group_bucket(n_heads: int, n_kv: int) -> int | None:
    """The kernel variant (GMAX) for this many query heads per KV head, or None if too many."""
    return next((g for g in GROUP_BUCKETS if g >= n_heads // n_kv), None)


def plan_splits(
    n_tokens: int, n_kv: int, max_seq_len: int, sm_count: int, n_heads: int, head_dim: int
) -> SplitPlan:
    """Split the context when (token, KV head) blocks alone would leave the GPU idle.

    Aims at about four blocks per multiprocessor, splits of at least MIN_SPLIT keys, at
    most MAX_SPLITS, and at most 64 MiB of partial sums. When the grid stays within four
    blocks per multiprocessor, the 128-register build (more blocks resident) is chosen for
    up to 4 heads per KV head and heads up to 256 wide: on the H200 the faster of the measured settings at
    most points, the misses within 15% (docs/tuning-log.md).
    """
    blocks = n_tokens * n_kv
    splits = 1
    if max_seq_len > MIN_SPLIT and blocks < 2 * sm_count:
        splits = min(cdiv(max_seq_len, MIN_SPLIT), cdiv(4 * sm_count, blocks), MAX_SPLITS)
        max_by_memory = max(1, (64 << 20) // max(1, n_tokens * n_heads * head_dim * 4))
        splits = max(1, min(splits, max_by_memory))
    gmax = group_bucket(n_heads, n_kv) or GROUP_BUCKETS[-1]
    # not at head dim 512: its 16-wide lane slices spill at 128 registers from 4 heads per KV head (sm_90 ptxas)
    min_blocks = 4 if gmax <= 4 and head_dim <= 256 and blocks * splits <= 4 * sm_count else 1
    if splits == 1:
        return SplitPlan(1, NO_SPLIT, min_blocks)
    split_len = cdiv(cdiv(max_seq_len, splits), 32) * 32
    return SplitPlan(cdiv(max_seq_len, split_len), split_len, min_blocks)


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
    min_blocks: int | None = None,
) -> Any:
    """`out [T, n_heads, D]` (float32) for float32 `q [T, n_heads, D]` over paged caches (float16, or FP8: kv_format.py).

    `min_blocks` (default: the plan's) > 1 asks the compiler to fit that many blocks per
    multiprocessor (fewer registers, perhaps spills)."""
    import cupy

    n_tok, n_heads, head_dim = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention supports head_dim {HEAD_DIMS}, got {head_dim}")
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads do not divide into {n_kv} KV heads")
    group = n_heads // n_kv
    gmax = group_bucket(n_heads, n_kv)
    if gmax is None:
        raise ValueError(f"attention supports up to {GROUP_BUCKETS[-1]} query heads per KV head, got {group}")
    if n_tok == 0:
        return out
    defines = {
        "ATTN_D": head_dim,
        "ATTN_G": gmax,
        "ATTN_MINB": plan.min_blocks if min_blocks is None else min_blocks,
    }
    kv = kv_operands(k_cache, v_cache)
    kernel = get_kernel("attention.cu", f"attn_d{head_dim}_g{gmax}", {**defines, **kv.defines})
    n_seqs = seq_lens.shape[0]
    part_acc = part_m = part_l = counters = NULL
    if plan.num_splits > 1:
        part_acc = cupy.empty((n_tok, n_heads, plan.num_splits, head_dim), cupy.float32)
        part_m = cupy.empty((n_tok, n_heads, plan.num_splits), cupy.float32)
        part_l = cupy.empty((n_tok, n_heads, plan.num_splits), cupy.float32)
        counters = split_counters(n_tok * n_kv)
    args = (
        q, kv.k, kv.v, query_start_loc, seq_lens, block_tables, i32(block_tables.shape[1]), i32(n_seqs),
        i32(n_heads), i32(n_kv), i32(block_size), f32(scale), f32(softcap or 0.0), i32(sliding_window or 0),
        i32(plan.split_len), out, part_acc, part_m, part_l, counters, *kv.scales,
    )  # fmt: skip
    launch(kernel, (n_tok, n_kv, plan.num_splits), (THREADS,), args)
    return out

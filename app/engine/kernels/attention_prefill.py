"""Wrapper of attention_prefill.cu: paged causal attention for prefill chunks on tensor cores."""

from __future__ import annotations

import functools
from typing import Any

from app.engine.kernels.runtime import pdl
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, launch

THREADS = 128  # PF_WARPS * 32
PAD = 8  # PF_PAD
HEAD_DIMS = (64, 128, 256)
RESIDENT = 2  # blocks per multiprocessor the register budget allows (128 threads at ~240 registers)
MIN_KEYS_PER_SPLIT = 256  # below this a split's partial sums cost more than its keys
MAX_SPLITS = 32
MAX_PARTIAL_BYTES = 64 << 20
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: a block may take more than the default 48 KB.
_MAX_DYNAMIC_SHARED = 8


def rows_per_block(head_dim: int) -> int:
    """PfShape::BM: (token, query head) rows per block, two 16-row tiles per warp below head dim 256."""
    return 64 if head_dim >= 256 else 128


def keys_per_tile(head_dim: int) -> int:
    """PfShape::BN."""
    return 64 if head_dim <= 64 else 32


def shared_bytes(head_dim: int) -> int:
    """PF_SMEM_BYTES: Q, two K buffers and one V buffer, rows padded."""
    return (rows_per_block(head_dim) + 3 * keys_per_tile(head_dim)) * (head_dim + PAD) * 2


def supports(head_dim: int, n_heads: int, n_kv: int) -> bool:
    return head_dim in HEAD_DIMS and n_kv > 0 and n_heads % n_kv == 0


def grid_tiles(n_tok: int, n_seqs: int, group: int, head_dim: int) -> int:
    """Blocks along x: every sequence's cdiv(q_len * group, rows per block) tiles fit in this bound."""
    return cdiv(n_tok * group, rows_per_block(head_dim)) + n_seqs


def plan_splits(
    n_tok: int, n_seqs: int, n_heads: int, n_kv: int, max_seq_len: int, sm_count: int, head_dim: int
) -> int:
    """KV splits for a batch whose tiles alone would not fill the GPU (a short chunk over a
    long cached context): about two waves of resident blocks, each split at least
    MIN_KEYS_PER_SPLIT keys, partial sums within MAX_PARTIAL_BYTES."""
    blocks = grid_tiles(n_tok, n_seqs, n_heads // n_kv, head_dim) * n_kv
    want = cdiv(2 * RESIDENT * sm_count, blocks)
    by_keys = cdiv(max_seq_len, MIN_KEYS_PER_SPLIT)
    by_memory = MAX_PARTIAL_BYTES // max(1, n_tok * n_heads * (head_dim + 2) * 4)
    return max(1, min(want, by_keys, by_memory, MAX_SPLITS))


@functools.cache
def _allow_shared(function_ptr: int, nbytes: int) -> None:
    """Let the kernel take `nbytes` of dynamic shared memory (cuFuncSetAttribute), once per function."""
    import ctypes

    status = pdl.driver_library().cuFuncSetAttribute(
        ctypes.c_void_p(function_ptr), ctypes.c_int(_MAX_DYNAMIC_SHARED), ctypes.c_int(nbytes)
    )
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared memory = {nbytes}) failed with CUDA error {status}")


def attention_prefill(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    query_start_loc: Any,
    seq_lens: Any,
    block_tables: Any,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    num_splits: int,
    out: Any,
) -> Any:
    """`out [T, n_heads, D]` (float32) for float32 `q [T, n_heads, D]` over float16 paged caches;
    any batch of sequences whose new tokens are their last ones (prefill chunks, decodes)."""
    import cupy

    n_tok, n_heads, head_dim = q.shape
    n_kv, block_size = k_cache.shape[2], k_cache.shape[1]
    if not supports(head_dim, n_heads, n_kv):
        raise ValueError(
            f"prefill attention: head_dim {head_dim} (supported {HEAD_DIMS}), {n_heads} heads "
            f"over {n_kv} KV heads"
        )
    if n_tok == 0:
        return out
    n_seqs = seq_lens.shape[0]
    smem = shared_bytes(head_dim)
    kernel = get_kernel("attention_prefill.cu", f"attn_prefill_d{head_dim}", {"PF_D": head_dim})
    _allow_shared(pdl.function_ptr(kernel), smem)
    part_o = part_ml = out
    if num_splits > 1:
        part_o = cupy.empty((n_tok, n_heads, num_splits, head_dim), cupy.float32)
        part_ml = cupy.empty((n_tok, n_heads, num_splits, 2), cupy.float32)
    args = (
        q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, i32(block_tables.shape[1]), i32(n_seqs),
        i32(n_heads), i32(n_kv), i32(block_size), f32(scale), f32(softcap or 0.0), i32(sliding_window or 0),
        out, part_o, part_ml,
    )  # fmt: skip
    grid = (grid_tiles(n_tok, n_seqs, n_heads // n_kv, head_dim), n_kv, num_splits)
    launch(kernel, grid, (THREADS,), args, shared_mem=smem)
    if num_splits > 1:
        merge = get_kernel("attention_prefill.cu", "attn_prefill_merge", {"PF_D": head_dim})
        launch(merge, (n_tok * n_heads,), (head_dim,), (part_o, part_ml, i32(num_splits), i32(head_dim), out))
    return out

"""Wrapper of kv_cache.cu: new keys and values into the paged cache (float16, or FP8 with block scales)."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.kv_format import is_fp8
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, launch

THREADS = 256
FP8_THREADS = 128  # KV_FP8_THREADS


def write_kv(k_cache: Any, v_cache: Any, k: Any, v: Any, slot_mapping: Any) -> None:
    """Store float32 `k`, `v [T, n_kv, D]` at their slots (< 0: padding, skipped). FP8 caches are
    updated as fp8_kv.Fp8KvCache.write does; their tokens that write one block must be consecutive."""
    n_tok = k.shape[0]
    row = k_cache.shape[2] * k_cache.shape[3]
    if k.shape[1] * k.shape[2] != row:
        raise ValueError(f"k of shape {k.shape} does not match cache rows of {k_cache.shape[2:]}")
    if n_tok == 0:
        return
    if is_fp8(k_cache):
        n_kv, head_dim, block_size = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
        launch(
            get_kernel("kv_cache.cu", "write_kv_fp8", {"KV_FP8": 1}),
            (n_tok, n_kv),
            (FP8_THREADS,),
            (k, v, k_cache.data, k_cache.scale, v_cache.data, v_cache.scale, slot_mapping, i32(n_tok), i32(n_kv),
             i32(head_dim), i32(block_size)),
        )  # fmt: skip
        return
    work = n_tok * row
    launch(
        get_kernel("kv_cache.cu", "write_kv"),
        (cdiv(work, THREADS),),
        (THREADS,),
        (k, v, k_cache, v_cache, slot_mapping, i32(n_tok), i32(row)),
    )

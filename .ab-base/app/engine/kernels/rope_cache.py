"""Wrapper of rope_cache.cu: QK-norm + RoPE + KV-cache write from a fused q/k/v projection."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.kv_cache import write_kv
from app.engine.kernels.kv_format import is_fp8
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, launch, ptr

BLOCK_THREADS = 256  # the kernel's launch bound (RC_THREADS)
MAX_HEAD_DIM = 2 * BLOCK_THREADS  # one thread per rotated pair: a 512-wide head fills a block


def supports(head_dim: int) -> bool:
    """Whether one block's threads, one per rotated pair, are whole warps (its norm is a block sum)."""
    return head_dim % 64 == 0 and head_dim <= MAX_HEAD_DIM


def heads_per_block(head_dim: int) -> int:
    """Heads of one token a block of rope_cache.cu holds: as many whole heads of head_dim / 2 threads as
    fit BLOCK_THREADS (4 of 128, 8 of 64, 2 of 256, 1 of 512). Fewer, fuller blocks than one per head;
    the kernel reads the count back from its block size; the emulator harnesses
    (tests/engine/cuda/host/fused_main.cpp, fp8_main.cpp) launch by the same rule."""
    return max(1, BLOCK_THREADS // (head_dim // 2))


def rope_cache(
    qkv: Any,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    q_norm: Any | None,
    k_norm: Any | None,
    eps: float,
    positions: Any,
    cos: Any,
    sin: Any,
    interleaved: bool,
    k_cache: Any,
    v_cache: Any,
    slots: Any,
    q_out: Any,
) -> Any:
    """Fill `q_out [T, n_heads, head_dim]` and store k, v of contiguous float32
    `qkv [T, (n_heads + 2 n_kv) * head_dim]` into the caches (see rope_cache.cu): float16 ones directly;
    FP8 ones through float32 rows that kv_cache.write_kv then stores (a block's scale needs them all)."""
    n_tok = qkv.shape[0]
    if qkv.shape[1] != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"qkv of shape {qkv.shape} is not {n_heads} + 2 x {n_kv} heads of {head_dim}")
    if cos.shape[1] * 2 > head_dim or not supports(head_dim):
        raise ValueError(
            f"rope_cache needs head_dim a multiple of 64 up to {MAX_HEAD_DIM} and at most head_dim / 2 "
            f"frequencies, got {head_dim} and {cos.shape[1]}"
        )
    if k_cache.shape[2] * k_cache.shape[3] != n_kv * head_dim:
        raise ValueError(f"cache rows of {k_cache.shape[2:]} do not hold {n_kv} heads of {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    if n_tok == 0:
        return q_out
    fp8 = is_fp8(k_cache)
    if fp8:
        import cupy

        k_out, v_out = (cupy.empty((n_tok, n_kv, head_dim), cupy.float32) for _ in range(2))
    else:
        k_out, v_out = k_cache, v_cache
    hpb = heads_per_block(head_dim)
    launch(
        get_kernel("rope_cache.cu", "rope_cache", {"KV_FP8": 1} if fp8 else None),
        (n_tok, cdiv(n_heads + 2 * n_kv, hpb)), (hpb * head_dim // 2,),
        (qkv, i32(n_heads), i32(n_kv), i32(head_dim), ptr(q_norm), ptr(k_norm), f32(eps), positions, cos, sin,
         i32(cos.shape[0]), i32(cos.shape[1]), i32(interleaved), k_out, v_out, slots, q_out),
    )  # fmt: skip
    if fp8:
        write_kv(k_cache, v_cache, k_out, v_out, slots)
    return q_out

"""Wrapper of rope_cache.cu: QK-norm + RoPE + KV-cache write from a fused q/k/v projection."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import f32, i32, launch, ptr


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
    `qkv [T, (n_heads + 2 n_kv) * head_dim]` into the float16 caches (see rope_cache.cu)."""
    n_tok = qkv.shape[0]
    if qkv.shape[1] != (n_heads + 2 * n_kv) * head_dim:
        raise ValueError(f"qkv of shape {qkv.shape} is not {n_heads} + 2 x {n_kv} heads of {head_dim}")
    if cos.shape[1] * 2 != head_dim or head_dim % 64:
        raise ValueError(f"rope_cache needs head_dim a multiple of 64 matching the table, got {head_dim}")
    if k_cache.shape[2] * k_cache.shape[3] != n_kv * head_dim:
        raise ValueError(f"cache rows of {k_cache.shape[2:]} do not hold {n_kv} heads of {head_dim}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm come together")
    if n_tok:
        launch(
            get_kernel("rope_cache.cu", "rope_cache"), (n_tok, n_heads + 2 * n_kv), (head_dim // 2,),
            (qkv, i32(n_heads), i32(n_kv), i32(head_dim), ptr(q_norm), ptr(k_norm), f32(eps), positions, cos, sin,
             i32(cos.shape[0]), i32(interleaved), k_cache, v_cache, slots, q_out),
        )  # fmt: skip
    return q_out

"""Wrapper of gated_delta.cu: Gated DeltaNet's gated delta rule (varlen prefill or a decode step, the
gates fused in) and its gated RMSNorm epilogue; at decode, the short conv before the rule and the norm after
it in the same launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, i64, launch

WARPS, COLS = 4, 32  # GDN_WARPS, GDN_COLS in gated_delta.cu
# A varlen batch whose longest sequence has this many rows takes gated_delta_chunked (16 tokens a round,
# 8 for head_k_dim 256; six barriers a round), shorter ones gated_delta_varlen (three barriers a token).
CHUNKED_FROM_TOKENS = 3
MAX_HEAD_K_DIM = 256  # state rows held in registers: head_k_dim / 4 per thread
MAX_CONV_K = 8  # GDN_CONV_MAX_K: the fused decode's conv taps


def _row_stride(a: Any, name: str) -> np.int64:
    if a.ndim != 2 or a.dtype.itemsize != 4 or a.strides[1] != 4:
        raise ValueError(f"{name} must be float32 rows of unit column stride, got {a.dtype} strides {a.strides}")
    return i64(a.strides[0] // 4)


def _launch_parts(
    mixed: Any, ba: Any, neg_a: Any, dt_bias: Any, state: Any, has_initial_state: Any, num_k_heads: int,
    tiled_v_heads: bool, out: Any,
) -> tuple[tuple, tuple, tuple[int, int, int], dict[str, int]]:  # fmt: skip
    """The checked arguments every gated delta kernel takes before and after its sequence metadata, the
    grid of a decode step (one block per 32 value columns, value head and row) and the build's defines."""
    _, n_v, dk, dv = state.shape
    if dk % WARPS or not 4 <= dk <= MAX_HEAD_K_DIM:
        raise ValueError(f"gated_delta_rule takes head_k_dim a multiple of {WARPS} up to {MAX_HEAD_K_DIM}, got {dk}")
    if n_v % num_k_heads:
        raise ValueError(f"{n_v} value heads do not divide into {num_k_heads} key heads")
    if mixed.shape[1] != 2 * num_k_heads * dk + n_v * dv or ba.shape[1] < 2 * n_v:
        raise ValueError(f"mixed {mixed.shape} / ba {ba.shape} do not match a state of {state.shape[1:]}")
    if has_initial_state.dtype.itemsize != 1:
        raise ValueError(f"has_initial_state must be bool, got {has_initial_state.dtype}")
    head = (mixed, _row_stride(mixed, "mixed"), ba, _row_stride(ba, "ba"), neg_a, dt_bias, state)
    tail = (has_initial_state, out, i32(num_k_heads), i32(n_v), i32(dv), i32(tiled_v_heads), f32(dk**-0.5))
    return head, tail, (cdiv(dv, COLS), n_v, mixed.shape[0]), {"GDN_DK": dk}


def gated_delta_rule(
    mixed: Any,
    ba: Any,
    neg_a: Any,
    dt_bias: Any,
    state: Any,
    query_start_loc: Any | None,
    state_slots: Any,
    has_initial_state: Any,
    num_k_heads: int,
    tiled_v_heads: bool,
    out: Any,
    max_query_len: int | None = None,
) -> Any:
    """`out [T, Hv, Dv]` float32 from the conv output `mixed [T, 2 Hk Dk + Hv Dv]` and the raw gates
    `ba [T, >= 2 Hv]` (b columns, then a columns), with `neg_a = -exp(A_log)` and `dt_bias [Hv]`;
    `state [slots, Hv, Dk, Dv]` float32 continued and updated in place per sequence (as
    causal_conv1d.causal_conv1d: `query_start_loc` None is a decode step, row i = sequence i). `max_query_len`
    (the longest sequence's rows; None: all T) picks the token-by-token or the chunked prefill kernel."""
    n_tok = mixed.shape[0]
    head, tail, grid, defines = _launch_parts(mixed, ba, neg_a, dt_bias, state, has_initial_state, num_k_heads,
                                              tiled_v_heads, out)  # fmt: skip
    n_seqs = int(state_slots.shape[0])
    if not n_tok or not n_seqs:
        return out
    grid = (*grid[:2], n_seqs)
    if query_start_loc is None:
        if n_seqs != n_tok:
            raise ValueError(f"a decode step takes one row per sequence: {n_tok} rows, {n_seqs} sequences")
        launch(get_kernel("gated_delta.cu", "gated_delta_decode", defines), grid, (WARPS * 32,),
               (*head, state_slots, *tail))  # fmt: skip
    else:
        chunked = min(n_tok, max_query_len or n_tok) >= CHUNKED_FROM_TOKENS
        name = "gated_delta_chunked" if chunked else "gated_delta_varlen"
        launch(get_kernel("gated_delta.cu", name, defines), grid, (WARPS * 32,),
               (*head, query_start_loc, state_slots, *tail))  # fmt: skip
    return out


def gated_delta_decode_fused(
    qkv: Any, conv_weight: Any, conv_state: Any, ba: Any, neg_a: Any, dt_bias: Any, state: Any, state_slots: Any,
    has_initial_state: Any, num_k_heads: int, tiled_v_heads: bool, z: Any, norm_weight: Any, eps: float, raw: Any,
    out: Any,
) -> Any:  # fmt: skip
    """A decode step (one row per sequence) of the short conv (SiLU, no bias: causal_conv1d), gated_delta_rule
    and gated_rms_norm in one launch, from the in-projection's q/k/v columns `qkv [T, C]` (any row stride) and
    the conv's `conv_weight [C, K]` and states `conv_state [slots, C, K-1]` (continued in place as the conv
    kernel does): `out [T, Hv, Dv]` = RMSNorm(o) * `norm_weight` * silu(`z`), z `[T, >= Hv Dv]` (any row
    stride); `raw` (`[T, Hv, Dv]`) receives o itself (scratch)."""
    from app.engine.kernels.attention import split_counters

    _, n_v, _, dv = state.shape
    n_tok, channels = qkv.shape
    n_seqs = int(state_slots.shape[0])
    if z.shape[0] != n_tok or z.shape[1] < n_v * dv:
        raise ValueError(f"gate z {z.shape} does not cover {n_v} heads of {dv} per token")
    if conv_weight.shape[0] != channels or not 2 <= conv_weight.shape[1] <= MAX_CONV_K:
        raise ValueError(f"conv weight {conv_weight.shape} is not [{channels}, 2..{MAX_CONV_K}]")
    if conv_state.shape[1:] != (channels, conv_weight.shape[1] - 1):
        raise ValueError(f"conv state {conv_state.shape} does not hold {conv_weight.shape[1] - 1} inputs of {channels}")
    if n_seqs != n_tok:
        raise ValueError(f"a decode step takes one row per sequence: {n_tok} rows, {n_seqs} sequences")
    head, tail, grid, defines = _launch_parts(qkv, ba, neg_a, dt_bias, state, has_initial_state, num_k_heads,
                                              tiled_v_heads, raw)  # fmt: skip
    if n_tok:
        counters = split_counters(n_seqs * (n_v + num_k_heads))
        norm = (z, _row_stride(z, "z"), norm_weight, f32(eps), counters, out)
        conv = (conv_weight, conv_state, i32(channels), i32(conv_weight.shape[1]), counters[n_seqs * n_v :])
        launch(get_kernel("gated_delta.cu", "gated_delta_decode_fused", defines), grid, (WARPS * 32,),
               (*head, state_slots, *tail, *norm, *conv))  # fmt: skip
    return out


def gated_rms_norm(x: Any, z: Any, weight: Any, eps: float, out: Any) -> Any:
    """`out [T, H, D]` = RMSNorm(`x [T, H, D]`) * `weight [D]` * silu(z), z `[T, >= H D]` (any row stride)."""
    n_tok, heads, dim = x.shape
    if z.shape[0] != n_tok or z.shape[1] < heads * dim:
        raise ValueError(f"gate z {z.shape} does not cover {heads} heads of {dim} per token")
    if n_tok:
        threads = min(1024, max(32, cdiv(dim, 4 * 32) * 32))
        launch(get_kernel("gated_delta.cu", "gated_rms_norm"), (n_tok * heads,), (threads,),
               (x, z, _row_stride(z, "z"), i32(heads), weight, f32(eps), out, i32(dim)))  # fmt: skip
    return out

"""Wrapper of ssd.cu: Mamba-2's varlen scan (prefill chunks and decodes in one launch) and its gated
group RMSNorm. Inputs that are column ranges of a wider activation (x, B, C of the conv's output; dt
and z of the input projection) are read in place: only their rows may be strided."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, i64, launch

SSD_WARPS = 4  # warps per scan block (ssd.cu)
SSD_ROWS = 4  # state rows per warp
MAX_STATE = 256  # d_state: the lanes hold up to 8 state columns each


def row_stride(array: Any, name: str) -> int:
    """The row stride (in float32 elements) of a float32 `[T, ...]` array whose rows are each
    contiguous; ValueError naming the array otherwise. An axis of length 1 may have any stride (a
    reshape leaves it whatever it likes: B and C of a model with one group are `[T, 1, N]`)."""
    if array.dtype != np.float32:
        raise ValueError(f"{name}: expected float32, got {array.dtype}")
    laid_out = all(
        array.strides[i] == 4 * math.prod(array.shape[i + 1 :]) for i in range(1, array.ndim) if array.shape[i] > 1
    )
    if not laid_out or array.strides[0] % 4:
        raise ValueError(f"{name}: each row must be contiguous float32 (shape {array.shape}, strides {array.strides})")
    return array.strides[0] // 4


def ssd_scan(
    x: Any,
    dt: Any,
    dt_bias: Any,
    a: Any,
    b: Any,
    c: Any,
    d: Any,
    state: Any,
    query_start_loc: Any,
    state_slots: Any,
    has_initial_state: Any,
    out: Any,
) -> Any:
    """`out [T, H, P]` = the scan of `x [T, H, P]` with raw `dt [T, H]` (softplus(dt + dt_bias) in the
    kernel), `a, d, dt_bias [H]`, `b, c [T, G, N]`, continuing `state [slots, H, P, N]` (float32, updated
    in place) per sequence: rows `query_start_loc[i]:[i+1]`, state row `state_slots[i]` (a negative one skips
    the sequence), from zeros where `has_initial_state[i]` is False (device arrays: int32, and bool as
    causal_conv1d takes it). Includes the D skip."""
    n_tok, n_heads, head_dim = x.shape
    n_groups, d_state = b.shape[1], b.shape[2]
    if n_heads % n_groups or c.shape != b.shape or dt.shape != (n_tok, n_heads) or b.shape[0] != n_tok:
        raise ValueError(
            f"ssd_scan: x {x.shape}, dt {dt.shape}, B {b.shape}, C {c.shape}: B and C must be [T, G, N] with G "
            "dividing the heads, dt [T, H]"
        )
    if state.shape[1:] != (n_heads, head_dim, d_state) or not state.flags.c_contiguous:
        raise ValueError(f"ssd_scan: state {state.shape} must be contiguous [slots, {n_heads}, {head_dim}, {d_state}]")
    if d_state > MAX_STATE:
        raise ValueError(f"ssd_scan: d_state {d_state} is above the kernel's {MAX_STATE}")
    for name, arr in (("query_start_loc", query_start_loc), ("state_slots", state_slots)):
        if arr.dtype != np.int32:
            raise ValueError(f"ssd_scan: {name} must be int32, got {arr.dtype}")
    if has_initial_state.dtype.itemsize != 1:
        raise ValueError(f"ssd_scan: has_initial_state must be bool (one byte a sequence), got {has_initial_state.dtype}")
    bc_stride = row_stride(b, "ssd_scan B")
    if row_stride(c, "ssd_scan C") != bc_stride:
        raise ValueError("ssd_scan: B and C must share their row stride")
    n_seqs = int(state_slots.shape[0])
    if not n_tok or not n_seqs:
        return out
    kernel = get_kernel("ssd.cu", "ssd_scan", {"SSD_NJ": cdiv(d_state, 32)})
    launch(
        kernel,
        (n_seqs, n_heads, cdiv(head_dim, SSD_WARPS * SSD_ROWS)),
        (SSD_WARPS * 32,),
        (x, i64(row_stride(x, "ssd_scan x")), dt, i64(row_stride(dt, "ssd_scan dt")), dt_bias, a, d, b, c,
         i64(bc_stride), state, query_start_loc, state_slots, has_initial_state, out, i32(n_heads), i32(head_dim),
         i32(n_groups), i32(d_state)),
    )  # fmt: skip
    return out


def norm_threads(group_size: int) -> int:
    """Threads of a gated norm block: ~4 channels each, a whole number of warps, at most 1024."""
    return min(1024, max(32, cdiv(cdiv(group_size, 4), 32) * 32))


def gated_group_rms_norm(y: Any, z: Any, weight: Any, eps: float, groups: int, out: Any) -> Any:
    """`out [T, C]` = `y * silu(z)` RMS-normalised within each of `groups` channel groups, times `weight [C]`."""
    n_tok, inner = y.shape
    if z.shape != y.shape or inner % groups or weight.shape != (inner,):
        raise ValueError(f"gated_group_rms_norm: y {y.shape}, z {z.shape}, weight {weight.shape}, {groups} groups")
    if n_tok:
        group_size = inner // groups
        launch(
            get_kernel("ssd.cu", "gated_group_rms_norm"),
            (n_tok, groups),
            (norm_threads(group_size),),
            (y, i64(row_stride(y, "gated norm y")), z, i64(row_stride(z, "gated norm z")), weight, out, i32(inner),
             i32(group_size), f32(eps)),
        )  # fmt: skip
    return out

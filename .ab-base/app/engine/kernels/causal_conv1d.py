"""Wrapper of causal_conv1d.cu: the depthwise causal conv (SiLU optional) of Gated DeltaNet and
Mamba-2 over a varlen batch, or one decode token per sequence, continuing per-sequence conv states.

Shared by both hybrid mixers: keep the signature generic (activation by name, bias optional).
"""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr

THREADS = 128
CHUNK = 64  # tokens a block walks in a varlen launch: a long prompt's chunks run in parallel
MAX_KERNEL = 8  # CONV_MAX_K in causal_conv1d.cu: taps held in registers
ACTIVATIONS = {None: 0, "silu": 1}


def causal_conv1d(
    x: Any,
    weight: Any,
    bias: Any | None,
    conv_state: Any,
    query_start_loc: Any | None,
    state_slots: Any,
    has_initial_state: Any,
    activation: str | None,
    out: Any,
    max_query_len: int | None = None,
) -> Any:
    """`out [T, C]` float32 = the conv of float32 `x [T, C]` (rows may be a column slice: any row
    stride, unit column stride) with `weight [C, K]` (+ `bias [C]`), then `activation` (None or
    "silu"). Sequence i owns rows `query_start_loc[i]:[i+1]`, or row i alone when `query_start_loc` is
    None (a decode step); it continues `conv_state[state_slots[i]]` (`[slots, C, K-1]` float32, updated
    in place) where `has_initial_state[i]` (bool), else starts from zeros; a negative slot skips it.
    Device int32 `query_start_loc`/`state_slots`, bool `has_initial_state`: nothing is read on the host.
    `max_query_len` (the longest sequence's rows, e.g. meta.max_query_len; None: all T rows) sizes the grid
    of CHUNK-token blocks."""
    n_tok, channels = x.shape
    k = weight.shape[1]
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown conv activation {activation!r}; expected one of {list(ACTIVATIONS)}")
    if not 1 <= k <= MAX_KERNEL:
        raise ValueError(f"causal_conv1d takes 1 to {MAX_KERNEL} taps, got a kernel of {k}")
    if weight.shape[0] != channels or conv_state.shape[1:] != (channels, k - 1):
        raise ValueError(
            f"conv of {channels} channels, {k} taps: weight {weight.shape} and state rows {conv_state.shape[1:]} "
            f"must be ({channels}, {k}) and ({channels}, {k - 1})"
        )
    if x.strides[1] != 4 or x.dtype.itemsize != 4:
        raise ValueError("causal_conv1d takes float32 rows of unit column stride")
    if has_initial_state.dtype.itemsize != 1:
        raise ValueError(f"has_initial_state must be bool (one byte a sequence), got {has_initial_state.dtype}")
    n_seqs = int(state_slots.shape[0])
    if not n_tok or not n_seqs:
        return out
    head = (x, i64(x.strides[0] // 4), weight, ptr(bias), conv_state)
    tail = (has_initial_state, out, i32(channels), i32(k), i32(ACTIVATIONS[activation]))
    if query_start_loc is None:
        if n_seqs != n_tok:
            raise ValueError(f"a decode conv takes one row per sequence: {n_tok} rows, {n_seqs} sequences")
        launch(get_kernel("causal_conv1d.cu", "causal_conv1d_update"), (cdiv(channels, THREADS), n_seqs),
               (THREADS,), (*head, state_slots, *tail))  # fmt: skip
    else:
        chunks = cdiv(min(n_tok, max_query_len or n_tok), CHUNK)
        launch(
            get_kernel("causal_conv1d.cu", "causal_conv1d_varlen"), (cdiv(channels, THREADS), n_seqs, chunks),
            (THREADS,), (*head, query_start_loc, state_slots, *tail, i32(CHUNK)),
        )  # fmt: skip
    return out

"""Mamba-2's selective state-space scan (SSD) written over an array module (numpy or CuPy): the
reference the Mamba-2 layer runs on, and the oracle its kernels will be tested against.

Per head h (of H, each `head_dim` P wide) the state is a `[P, N]` matrix S, and per token t

    S <- exp(dt_t A_h) S + dt_t x_t B_t^T        y_t = S C_t + D_h x_t

with `dt_t > 0` (softplus of the projection plus dt_bias, computed by the layer), `A_h < 0`, and B, C
shared by the H / G heads of each of G groups (head h reads group h // (H / G), Hugging Face's
repeat_interleave). Two forms of the same recurrence: token by token (decode, short chunks), and
chunked (prefill: within a chunk of L tokens the updates become L x L "attention" products with a
causal decay mask; the state carries from chunk to chunk) as transformers' `torch_forward` and the
Mamba-2 paper's SSD algorithm compute it. The batch's sequences and their state rows come from
`recurrent_reference.sequences`, like every recurrent op's; a decode batch (one token per sequence)
steps all its sequences at once, on the device's copies of the slots.
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.recurrent_reference import sequences

SSD_RECURRENT_MAX_TOKENS = 8  # a sequence's chunk up to this long runs token by token
SOFTPLUS_THRESHOLD = 20.0  # torch's softplus is the identity above it


def ssd_scan(
    xp: Any,
    x: Any,
    dt: Any,
    a: Any,
    b: Any,
    c: Any,
    d: Any,
    ssm_state: Any,
    meta: AttentionMetadata,
    chunk_size: int,
) -> Any:
    """The scan over the batch's sequences: `x [T, H, P]`, `dt [T, H]`, `a, d [H]`, `b, c [T, G, N]`;
    `ssm_state [slots, H, P, N]` float32, continued per sequence and updated in place. Returns
    `y [T, H, P]` including the `D x` skip. A sequence's chunk longer than `chunk_size` is scanned
    `chunk_size` tokens at a time (the SSD matrices are chunk_size^2 per head)."""
    f32 = xp.float32
    x, dt, b, c = (arr.astype(f32, copy=False) for arr in (x, dt, b, c))
    heads = x.shape[1]
    b, c = (_heads_for_groups(xp, arr, heads) for arr in (b, c))
    if meta.decode_only and meta.state_slots is not None:
        return ssd_decode_step(xp, x, dt, a, b, c, ssm_state, meta) + x * d.astype(f32, copy=False)[:, None]
    out = xp.empty(x.shape, f32)
    for start, end, slot, initial in sequences(meta):
        state = ssm_state[slot].astype(f32, copy=True) if initial else xp.zeros(ssm_state.shape[1:], f32)
        for lo in range(start, end, chunk_size):
            hi = min(lo + chunk_size, end)
            form = ssd_recurrent if hi - lo <= SSD_RECURRENT_MAX_TOKENS else ssd_chunked
            out[lo:hi], state = form(xp, x[lo:hi], dt[lo:hi], a, b[lo:hi], c[lo:hi], state)
        ssm_state[slot] = state
    return out + x * d.astype(f32, copy=False)[:, None]


def ssd_decode_step(
    xp: Any, x: Any, dt: Any, a: Any, b: Any, c: Any, ssm_state: Any, meta: AttentionMetadata
) -> Any:
    """A decode step (one token per sequence) for the whole batch at once, on the device's copies of
    the slots: row i is `ssd_recurrent` of sequence i's one token (from zeros where it starts here).
    `x [B, H, P]`, `dt [B, H]`, `b, c [B, H, N]` (per head). Returns `y [B, H, P]` without the D skip."""
    slots = meta.state_slots
    state = ssm_state[slots]  # a copy: [B, H, P, N]
    state = xp.where(meta.has_initial_state[:, None, None, None], state, state.dtype.type(0.0))
    decay = xp.exp(dt * a)  # [B, H]
    state = state * decay[:, :, None, None] + (dt[:, :, None] * x)[..., None] * b[:, :, None, :]
    ssm_state[slots] = state
    return (state @ c[..., None])[..., 0]


def _heads_for_groups(xp: Any, x: Any, heads: int) -> Any:
    """`[T, G, N]` -> `[T, H, N]`: each group's B or C repeated for its H / G consecutive heads."""
    r = heads // x.shape[1]
    return x if r == 1 else xp.repeat(x, r, axis=1)


def ssd_recurrent(xp: Any, x: Any, dt: Any, a: Any, b: Any, c: Any, state: Any) -> tuple[Any, Any]:
    """Token by token, for one sequence: `x [L, H, P]`, `dt [L, H]`, `a [H]`, `b, c [L, H, N]`, state
    `[H, P, N]` -> (`y [L, H, P]` without the D skip, the state after the last token)."""
    out = xp.empty(x.shape, x.dtype)
    decay = xp.exp(dt * a)  # [L, H]
    for t in range(x.shape[0]):
        state = state * decay[t, :, None, None] + (dt[t, :, None] * x[t])[:, :, None] * b[t, :, None, :]
        out[t] = (state @ c[t, :, :, None])[..., 0]
    return out, state


def ssd_chunked(xp: Any, x: Any, dt: Any, a: Any, b: Any, c: Any, state: Any) -> tuple[Any, Any]:
    """The same as `ssd_recurrent` for one chunk, in matrix form: with `cum` the running sum of
    `dt A` over the chunk, token i reads token j <= i through `(C_i . B_j) exp(cum_i - cum_j) dt_j x_j`
    and the incoming state through `exp(cum_i) C_i S`; the outgoing state is the incoming one decayed
    by `exp(cum_last)` plus every token's `dt_j x_j B_j^T` decayed to the chunk's end."""
    f32 = xp.float32
    adt = dt * a  # [L, H], <= 0
    cum = xp.cumsum(adt, axis=0)
    xdt = x * dt[:, :, None]  # [L, H, P]
    bh, ch = b.swapaxes(0, 1), c.swapaxes(0, 1)  # [H, L, N]
    scores = (ch @ bh.swapaxes(1, 2)) * xp.exp(_segment_sums(xp, adt))  # [H, L, L]
    y = scores @ xdt.swapaxes(0, 1)  # [H, L, P]
    y = y + (ch @ state.swapaxes(1, 2)) * xp.exp(cum).T[:, :, None]
    to_end = xp.exp(cum[-1] - cum)  # [L, H]: each token's decay to the chunk's end
    new_state = state * xp.exp(cum[-1])[:, None, None] + (xdt * to_end[:, :, None]).transpose(1, 2, 0) @ bh
    return y.swapaxes(0, 1).astype(f32, copy=False), new_state.astype(f32, copy=False)


def _segment_sums(xp: Any, adt: Any) -> Any:
    """`[L, H]` -> `[H, L, L]`: entry (i, j) is the sum of adt over positions j+1..i (0 on the
    diagonal), -inf above it. Summed as a masked running sum, not as a difference of running sums,
    so a long chunk's large totals do not cancel away the small ones (transformers' segment_sum)."""
    n = adt.shape[0]
    strict = xp.tril(xp.ones((n, n), dtype=bool), -1)
    spread = xp.where(strict, adt.T[:, :, None], adt.dtype.type(0.0))  # [H, i, j] = adt[i] for i > j
    sums = xp.cumsum(spread, axis=1)
    return xp.where(xp.tril(xp.ones((n, n), dtype=bool)), sums, -xp.inf).astype(adt.dtype, copy=False)


def softplus(xp: Any, x: Any) -> Any:
    """`log(1 + exp(x))`, the identity above SOFTPLUS_THRESHOLD (torch's F.softplus)."""
    return xp.where(x > SOFTPLUS_THRESHOLD, x, xp.log1p(xp.exp(xp.minimum(x, SOFTPLUS_THRESHOLD))))


def gated_group_rms_norm(xp: Any, y: Any, z: Any, weight: Any, eps: float, groups: int) -> Any:
    """`y * silu(z)`, RMS-normalised within each of `groups` equal channel groups, times `weight`
    (Mamba-2's gated norm with norm_before_gate=False): `[T, C]` float32."""
    one = xp.float32(1.0)
    gated = y * (z / (one + xp.exp(-z)))
    grouped = gated.reshape(gated.shape[0], groups, -1)
    scale = one / xp.sqrt((grouped * grouped).mean(axis=-1, keepdims=True) + xp.float32(eps))
    return (grouped * scale).reshape(gated.shape) * weight

"""Recurrent-layer ops written once over an array module (numpy or CuPy): the reference that hybrid
models' layers run on, and the oracle their kernels are tested against.

Each op walks the batch's sequences on the host (`meta.host_query_start_loc`, `host_state_slots`,
`host_has_initial_state`): sequence i's flat rows `qsl[i]:qsl[i+1]` continue the state in row
`state_slots[i]` of the layer's state arrays, or start from zeros where `has_initial_state[i]` is
False (its chunk starts at position 0), and leave the state after their last token in that row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata
from app.engine.specs import GatedDeltaNetSpec


def sequences(meta: AttentionMetadata) -> Iterator[tuple[int, int, int, bool]]:
    """(start row, end row, state slot, continues its state) of each sequence in the batch."""
    qsl, slots, initial = meta.host_query_start_loc, meta.host_state_slots, meta.host_has_initial_state
    assert qsl is not None and slots is not None and initial is not None, (
        "a recurrent step needs host state metadata"
    )
    for i in range(len(slots)):
        yield int(qsl[i]), int(qsl[i + 1]), int(slots[i]), bool(initial[i])


def causal_conv1d(
    xp: Any,
    x: Any,
    weight: Any,
    bias: Any | None,
    conv_state: Any,
    meta: AttentionMetadata,
    silu: bool = True,
) -> Any:
    """Depthwise causal conv over time of `x [T, C]` with `weight [C, K]` (PyTorch's `[C, 1, K]`
    squeezed; tap K-1 multiplies the current input), per sequence, continuing from the K-1 inputs
    before its chunk kept in `conv_state [slots, C, K-1]` (zeros for a sequence that starts here),
    then SiLU when `silu`. Float32 out; the state rows are updated in place."""
    f32 = xp.float32
    x = x.astype(f32, copy=False)
    w = weight.astype(f32, copy=False)
    k = w.shape[1]
    out = xp.empty_like(x)
    decoding = []  # (row, slot, continues) of one-token sequences: one batched step for all of them
    for start, end, slot, initial in sequences(meta):
        if end - start == 1:
            decoding.append((start, slot, initial))
            continue
        past = conv_state[slot].T if initial else xp.zeros((k - 1, x.shape[1]), f32)  # [K-1, C]
        xs = xp.concatenate([past.astype(f32, copy=False), x[start:end]], axis=0)  # [K-1+L, C]
        n = end - start
        y = xs[0:n] * w[:, 0]
        for tap in range(1, k):
            y = y + xs[tap : tap + n] * w[:, tap]
        if bias is not None:
            y = y + bias.astype(f32, copy=False)
        out[start:end] = y
        conv_state[slot] = xs[-(k - 1) :].T
    if decoding:  # the same taps in the same order, over [B, C, K] windows
        rows, slots, initial = (xp.asarray(np.array(c)) for c in zip(*decoding, strict=True))
        past = conv_state[slots].astype(f32, copy=True)  # [B, C, K-1]
        past[~initial] = 0
        window = xp.concatenate([past, x[rows][:, :, None]], axis=2)  # [B, C, K]
        y = window[:, :, 0] * w[:, 0]
        for tap in range(1, k):
            y = y + window[:, :, tap] * w[:, tap]
        if bias is not None:
            y = y + bias.astype(f32, copy=False)
        out[rows] = y
        conv_state[slots] = window[:, :, 1:]
    if silu:
        out = out / (f32(1.0) + xp.exp(-out))
    return out


# Gated DeltaNet (Qwen3.5, Qwen3-Next): per head, a `[Dk, Dv]` state S and per token t
#   S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - k_t S))^T;  o_t = q_t S
# with q, k L2-normalised and q scaled by 1/sqrt(Dk). Two forms of the same recurrence: token by
# token (decode, short chunks), and chunked (prefill: within a chunk of CHUNK tokens the updates are
# condensed into matrix products through a unit lower-triangular solve, the "WY/UT" form of fla and
# transformers' torch_chunk_gated_delta_rule; the state is carried from chunk to chunk).
GDN_CHUNK = 64
GDN_RECURRENT_MAX_TOKENS = 8  # a sequence's chunk up to this long runs token by token
L2_EPS = 1e-6  # fla's (and transformers') q/k L2-norm epsilon


def l2_normalize(xp: Any, x: Any, eps: float = L2_EPS) -> Any:
    """`x / sqrt(sum(x^2) + eps)` over the last axis (fla's l2norm)."""
    return x / xp.sqrt((x * x).sum(axis=-1, keepdims=True) + x.dtype.type(eps))


def gated_delta_rule(
    xp: Any,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state: Any,
    meta: AttentionMetadata,
    tiled_v_heads: bool = False,
) -> Any:
    """The gated delta rule over the batch's sequences: `q, k [T, Hk, Dk]` (raw: L2-normalised and
    scaled here), `v [T, Hv, Dv]`, log-decay `g [T, Hv]` (<= 0), `beta [T, Hv]`; `state [slots, Hv,
    Dk, Dv]` float32, continued per sequence (sequences(meta)) and updated in place. Each q/k head
    serves Hv / Hk value heads: consecutive ones (Hugging Face's order), or every Hk-th one when
    `tiled_v_heads` (llama.cpp's Qwen3.5 GGUFs reorder the value heads so). Returns `[T, Hv, Dv]`."""
    f32 = xp.float32
    q, k = (l2_normalize(xp, a.astype(f32, copy=False)) for a in (q, k))
    q = q * f32(q.shape[-1] ** -0.5)
    q, k = (_heads_for_values(xp, a, v.shape[1], tiled_v_heads) for a in (q, k))
    v, g, beta = (a.astype(f32, copy=False) for a in (v, g, beta))
    out = xp.empty(v.shape, f32)
    decoding = []  # (row, slot, continues) of one-token sequences: one batched step for all of them
    for start, end, slot, initial in sequences(meta):
        if end - start == 1:
            decoding.append((start, slot, initial))
            continue
        s = state[slot].astype(f32, copy=True) if initial else xp.zeros(state.shape[1:], f32)
        rows = slice(start, end)
        form = delta_rule_recurrent if end - start <= GDN_RECURRENT_MAX_TOKENS else delta_rule_chunked
        # per head: [H, L, D] and [H, L]
        o, s = form(xp, *(a[rows].swapaxes(0, 1) for a in (q, k, v, g, beta)), s)
        out[rows] = o.swapaxes(0, 1)
        state[slot] = s
    if decoding:
        rows, slots, initial = (xp.asarray(np.array(c)) for c in zip(*decoding, strict=True))
        s = state[slots].astype(f32, copy=True)  # [B, H, Dk, Dv]
        s[~initial] = 0  # sequences that start here: their rows' old contents are not theirs
        out[rows], state[slots] = delta_step(xp, s, q[rows], k[rows], v[rows], g[rows], beta[rows])
    return out


def gated_delta_net_rule(
    xp: Any, mixed: Any, ba: Any, neg_a: Any, dt_bias: Any, state: Any, meta: AttentionMetadata, spec: GatedDeltaNetSpec
) -> Any:
    """Gated DeltaNet's rule from what its layer has at hand: the conv output `mixed [T, conv_dim]` (q
    heads, k heads, v heads), the raw gates `ba [T, >= 2 Hv]` (b columns, then a columns), `neg_a =
    -exp(A_log)` and `dt_bias [Hv]`: `beta = sigmoid(b)`, `g = neg_a * softplus(a + dt_bias)`, then
    `gated_delta_rule`. What kernels/gated_delta.py fuses into one launch. Returns `[T, Hv, Dv]`."""
    n, hv = mixed.shape[0], spec.num_v_heads
    key_dim = spec.num_k_heads * spec.head_k_dim
    q = mixed[:, :key_dim].reshape(n, spec.num_k_heads, spec.head_k_dim)
    k = mixed[:, key_dim : 2 * key_dim].reshape(n, spec.num_k_heads, spec.head_k_dim)
    v = mixed[:, 2 * key_dim :].reshape(n, hv, spec.head_v_dim)
    ba = ba.astype(xp.float32, copy=False)
    beta = sigmoid(xp, ba[:, :hv])
    g = neg_a * softplus(xp, ba[:, hv : 2 * hv] + dt_bias)
    return gated_delta_rule(xp, q, k, v, g, beta, state, meta, spec.tiled_v_heads)


def sigmoid(xp: Any, x: Any) -> Any:
    return x.dtype.type(1.0) / (x.dtype.type(1.0) + xp.exp(-x))


def softplus(xp: Any, x: Any) -> Any:
    """PyTorch's softplus (threshold 20: the identity above it)."""
    return xp.where(x > 20, x, xp.log1p(xp.exp(xp.minimum(x, 20))))


def gated_rms_norm(xp: Any, x: Any, z: Any, weight: Any, eps: float) -> Any:
    """`[T, H, D]`: RMSNorm of `x [T, H, D]` per head times `weight [D]`, times silu of the gate `z [T, H D]`
    (Gated DeltaNet's output norm), float32."""
    f32 = xp.float32
    x = x.astype(f32, copy=False)
    z = z.reshape(x.shape).astype(f32, copy=False)
    normed = x / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + f32(eps)) * weight
    return normed * (z * sigmoid(xp, z))


def _heads_for_values(xp: Any, x: Any, num_v_heads: int, tiled: bool) -> Any:
    """`[T, Hk, D]` -> `[T, Hv, D]`: each q/k head repeated for the value heads it serves."""
    r = num_v_heads // x.shape[1]
    if r == 1:
        return x
    return xp.tile(x, (1, r, 1)) if tiled else xp.repeat(x, r, axis=1)


def delta_rule_recurrent(xp: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, s: Any) -> tuple[Any, Any]:
    """Token by token, for one sequence: `q, k [H, L, Dk]`, `v [H, L, Dv]`, `g, beta [H, L]`, state
    `s [H, Dk, Dv]` -> (`[H, L, Dv]`, the state after the last token)."""
    out = xp.empty(v.shape, v.dtype)
    for t in range(q.shape[1]):
        out[:, t], s = delta_step(xp, s, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
    return out, s


def delta_step(xp: Any, s: Any, q: Any, k: Any, v: Any, g: Any, beta: Any) -> tuple[Any, Any]:
    """One token of the recurrence over any leading dims (heads; or sequences, heads for a batch of
    decodes): state `s [..., Dk, Dv]`, `q, k [..., Dk]`, `v [..., Dv]`, `g, beta [...]` -> (output
    `[..., Dv]`, the new state)."""
    s = s * xp.exp(g)[..., None, None]
    predicted = xp.einsum("...k,...kv->...v", k, s)
    delta = (v - predicted) * beta[..., None]
    s = s + k[..., :, None] * delta[..., None, :]
    return xp.einsum("...k,...kv->...v", q, s), s


def delta_rule_chunked(
    xp: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, s: Any, chunk: int = GDN_CHUNK
) -> tuple[Any, Any]:
    """The same as `delta_rule_recurrent`, `chunk` tokens at a time (transformers'
    torch_chunk_gated_delta_rule for one sequence). Padding tokens (k = v = beta = g = 0) leave the
    state as it is."""
    f32 = xp.float32
    h, n = q.shape[0], q.shape[1]
    pad = (-n) % chunk
    if pad:
        q, k, v = (xp.concatenate([a, xp.zeros((h, pad, a.shape[2]), f32)], axis=1) for a in (q, k, v))
        g, beta = (xp.concatenate([a, xp.zeros((h, pad), f32)], axis=1) for a in (g, beta))
    chunks = q.shape[1] // chunk
    q, k, v = (a.reshape(h, chunks, chunk, a.shape[-1]) for a in (q, k, v))
    g, beta = g.reshape(h, chunks, chunk), beta.reshape(h, chunks, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = xp.cumsum(g, axis=-1)  # log of the decay from the chunk's start to each position
    causal = xp.tril(xp.ones((chunk, chunk), dtype=bool))
    # decay between positions j <= i of a chunk; 0 above the diagonal (exp of -inf, without overflow)
    pairwise = xp.exp(xp.where(causal, cum[..., :, None] - cum[..., None, :], -xp.inf)).astype(f32)
    # (I + strictly-lower(beta_i k_i . k_j decay_ij)) X = [v_beta | k_beta exp(cum)]: the UT transform
    system = xp.tril((k_beta @ k.swapaxes(-1, -2)) * pairwise, -1) + xp.eye(chunk, dtype=f32)
    rhs = xp.concatenate([v_beta, k_beta * xp.exp(cum)[..., None]], axis=-1)
    solved = xp.linalg.solve(system, rhs).astype(f32, copy=False)
    dv = v.shape[-1]
    new_values, k_cumdecay = solved[..., :dv], solved[..., dv:]
    intra = (q @ k.swapaxes(-1, -2)) * pairwise
    q_decayed = q * xp.exp(cum)[..., None]
    k_decayed = k * xp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = xp.exp(cum[..., -1])  # [H, chunks]
    out = xp.empty((h, chunks, chunk, dv), f32)
    for i in range(chunks):
        v_new = new_values[:, i] - k_cumdecay[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + intra[:, i] @ v_new
        s = s * chunk_decay[:, i, None, None] + k_decayed[:, i].swapaxes(-1, -2) @ v_new
    return out.reshape(h, chunks * chunk, dv)[:, :n], s

"""Decode attention over the paged KV cache, in numba: one query token per sequence.

The numpy reference (reference_attention.py) gathers each sequence's blocks into fresh float32
arrays, builds the score matrix with its mask and runs ~20 numpy calls per layer; for a decode
step that is mostly overhead (measured ~1 ms a layer at a 512-token context on this VM, 18 ms a
token for Gemma 3 270M). Here each (sequence, KV head) pair reads its keys and values in place,
block by block, and the query heads that share the KV head reuse each key and value row while it
is in L1. The arithmetic is the reference's in its order (dot, `* scale`, softcap, minus the max,
exp, divide by the sum, weighted sum of values); only the summation order differs.

A prefill chunk keeps the reference's BLAS products (one matrix product per head beats a loop).
Self-contained on purpose: numba's disk cache checks only the cached function's own file.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_FLAGS = dict(nogil=True, cache=True, fastmath={"reassoc"}, error_model="numpy")
# Prefill softmax also assumes no NaN, so LLVM vectorises its running maximum (a NaN score is garbage
# either way: it came from NaN activations).
_SOFTMAX_FLAGS = dict(_FLAGS, fastmath={"reassoc", "nnan"})


_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.44269504088896341), np.float32(0.693359375), np.float32(-2.12194440e-4)
_EXP_POLY = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
             np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))  # fmt: skip


@intrinsic
def _times_pow2(typingctx, p, n):
    """`p * 2**n` for a normal float32 `p` and int32 `n` keeping it normal: n added to the exponent
    bits (one integer add; numba has no scalar bit cast of its own)."""
    if not (p == types.float32 and n == types.int32):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.add(builder.bitcast(args[0], i32), builder.shl(args[1], i32(23)))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(p, n), codegen


@njit(inline="always")
def _exp(x):
    """exp(x) for x <= 0: Cephes' expf (x = n ln 2 + r, a degree-7 polynomial in r), within 1e-7
    relative of the exact value (numpy's exp: 2e-7). numba's np.exp calls libm once per value; this
    vectorises (9x the rate on AVX2), and prefill softmax exponentiates half a million values a layer
    at a 512-token prompt. Below -87 it gives exp(-87), ~1e-38: nothing next to a softmax row's
    maximum, exp(0) = 1."""
    x = np.float32(max(np.float32(x), np.float32(-87.0)))
    n = np.float32(np.floor(x * _LOG2E + np.float32(0.5)))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    c0, c1, c2, c3, c4, c5 = _EXP_POLY
    p = ((((c0 * r + c1) * r + c2) * r + c3) * r + c4) * r + c5
    return _times_pow2(np.float32((p * r) * r + r + np.float32(1.0)), np.int32(n))


@njit(inline="always")
def _exp_shifted(row, first, stop, top):
    """`row[first:stop] = exp(row[first:stop] - top)` (values <= top) in place; returns their sum."""
    total = np.float32(0.0)
    for j in range(first, stop):
        e = _exp(row[j] - top)
        row[j] = e
        total += e
    return total


@njit(parallel=True, **_FLAGS)
def attention_decode(
    q, k_cache, v_cache, tables, starts, seq_lens, scale, window, softcap, out
):  # pragma: no cover
    """`out[t] = attention(q[t])` for the one query token `t = starts[i]` of each sequence `i`.

    `k_cache`/`v_cache [blocks, block_size, n_kv, d]` float32; `tables [B, max_blocks]`;
    `window` 0 for none (else keys at positions >= ctx - window are seen); `softcap` 0 for none."""
    n_heads, d = q.shape[1], q.shape[2]
    block_size, n_kv = k_cache.shape[1], k_cache.shape[2]
    group = n_heads // n_kv
    scale, softcap = np.float32(scale), np.float32(softcap)
    for task in prange(seq_lens.shape[0] * n_kv):
        i, h = task // n_kv, task % n_kv
        t, ctx = starts[i], seq_lens[i]
        first = max(0, ctx - window) if window > 0 else 0
        scores = np.empty((group, ctx - first), np.float32)
        for p in range(first, ctx):
            key = k_cache[tables[i, p // block_size], p % block_size, h]
            for g in range(group):
                qv = q[t, h * group + g]
                s = np.float32(0.0)
                for k in range(d):
                    s += qv[k] * key[k]
                s = s * scale
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                scores[g, p - first] = s
        for g in range(group):
            row = scores[g]
            total = _exp_shifted(row, 0, row.shape[0], row.max())
            for j in range(row.shape[0]):
                row[j] = row[j] / total
        acc = np.zeros((group, d), np.float32)
        for p in range(first, ctx):
            value = v_cache[tables[i, p // block_size], p % block_size, h]
            for g in range(group):
                w = scores[g, p - first]
                for k in range(d):
                    acc[g, k] += w * value[k]
        for g in range(group):
            out[t, h * group + g] = acc[g]


@njit(parallel=True, **_SOFTMAX_FLAGS)
def causal_softmax(scores, n_q, ctx, scale, window, softcap):  # pragma: no cover
    """A prefill chunk's probabilities, in place: `scores [n_kv, group * n_q, ctx]` holds q . k (rows
    ordered (group, query)), the chunk's queries being the last `n_q` of `ctx` positions. Each row is
    scaled, softcapped (`softcap` 0: none), masked causally (and to the last `window` keys; 0: none)
    and softmaxed: the reference's ~10 whole-array numpy passes in one pass per row."""
    scale, softcap = np.float32(scale), np.float32(softcap)
    n_rows = scores.shape[1]
    for task in prange(scores.shape[0] * n_rows):
        row = scores[task // n_rows, task % n_rows]
        q_pos = ctx - n_q + (task % n_rows) % n_q
        first = max(0, q_pos - window + 1) if window > 0 else 0
        # the visible keys as their own slice, indexed from 0: LLVM then knows no index is negative
        # (numba wraps those around) and vectorises each loop; over `range(first, ...)` it did not (5x)
        seen = row[first : q_pos + 1]
        if softcap > 0:
            for j in range(seen.shape[0]):
                seen[j] = softcap * np.tanh(seen[j] * scale / softcap)
        else:
            for j in range(seen.shape[0]):
                seen[j] = seen[j] * scale
        top = np.float32(-np.inf)  # float32 throughout, and its own loop: vectorised
        for j in range(seen.shape[0]):
            top = max(top, seen[j])
        inv = np.float32(1.0) / _exp_shifted(seen, 0, seen.shape[0], top)
        for j in range(seen.shape[0]):
            seen[j] = seen[j] * inv
        row[:first] = 0.0
        row[q_pos + 1 :] = 0.0

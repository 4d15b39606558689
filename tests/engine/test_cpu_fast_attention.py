"""The numba attention (backend/cpu_fast/attention.py) against the numpy reference.

Same paged cache, same metadata: outputs agree to float32 summation order (1e-5 of the values'
scale), for decode steps and prefill chunks, across batch, grouped query heads, sliding windows and
softcap; what the fast path does not take (sinks, a float16 cache) gives the reference's result exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cpu_fast.backend import FastCpuBackend

BLOCK, N_KV, D = 4, 2, 32


def _meta(
    seq_lens: list[int], q_lens: list[int], rng: np.random.Generator, n_blocks: int
) -> AttentionMetadata:
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    width = max(-(-n // BLOCK) for n in seq_lens)
    # each sequence's blocks are a random, non-contiguous choice from the pool
    tables = np.stack([rng.permutation(n_blocks)[:width] for _ in seq_lens]).astype(np.int32)
    positions = np.concatenate([np.arange(n - q, n) for n, q in zip(seq_lens, q_lens, strict=True)]).astype(
        np.int32
    )
    return AttentionMetadata(
        query_start_loc=starts, seq_lens=np.array(seq_lens, np.int32), block_tables=tables,
        slot_mapping=np.zeros(len(positions), np.int32), positions=positions, max_query_len=max(q_lens),
        max_seq_len=max(seq_lens), block_size=BLOCK, host_query_start_loc=starts,
        host_seq_lens=np.array(seq_lens, np.int32),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("seq_lens", "q_lens", "n_heads", "window", "softcap"),
    [
        ([1], [1], 2, None, None),
        ([13, 5, 30], [1, 1, 1], 4, None, None),
        ([30, 9], [1, 1], 8, 6, None),
        ([17], [1], 4, None, 20.0),
        ([22, 3], [1, 1], 4, 8, None),
        ([12], [12], 4, None, None),  # a whole prompt
        ([30, 7, 9], [11, 1, 9], 8, 6, None),  # a later chunk, a decode and a prompt in one batch
        ([20], [20], 2, None, 20.0),
        ([150], [150], 4, None, None),  # a prompt over several causal chunks of the workers
        ([200, 9], [140, 9], 4, 40, 20.0),  # a later chunk over several, windowed and softcapped
    ],
)
def test_attention_matches_the_reference(seq_lens, q_lens, n_heads, window, softcap) -> None:
    """Decode steps (numba kernel) and prefill chunks (BLAS around the numba softmax, in causal
    chunks of queries over the workers)."""
    rng = np.random.default_rng(sum(seq_lens) + n_heads)
    n_blocks = max(24, -(-max(seq_lens) // BLOCK))
    k_cache = rng.standard_normal((n_blocks, BLOCK, N_KV, D)).astype(np.float32)
    v_cache = rng.standard_normal((n_blocks, BLOCK, N_KV, D)).astype(np.float32)
    meta = _meta(seq_lens, q_lens, rng, n_blocks)
    q = rng.standard_normal((sum(q_lens), n_heads, D)).astype(np.float32)
    args = (q, k_cache, v_cache, meta, D**-0.5, window, softcap)
    ours, expected = FastCpuBackend().attention(*args), CpuBackend().attention(*args)
    assert ours.dtype == np.float32 and ours.shape == q.shape
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_sinks_and_float16_caches_keep_the_reference() -> None:
    rng = np.random.default_rng(5)
    k_cache, v_cache = (rng.standard_normal((8, BLOCK, N_KV, D)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, 4, D)).astype(np.float32)
    fast, ref = FastCpuBackend(), CpuBackend()
    decode = _meta([9], [1], rng, 8)
    sinks = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(
        fast.attention(q, k_cache, v_cache, decode, 0.2, sinks=sinks),
        ref.attention(q, k_cache, v_cache, decode, 0.2, sinks=sinks),
    )
    k16, v16 = k_cache.astype(np.float16), v_cache.astype(np.float16)
    np.testing.assert_array_equal(
        fast.attention(q, k16, v16, decode, 0.2), ref.attention(q, k16, v16, decode, 0.2)
    )

"""attention_decode.cu (one query token per sequence) on the SIMT emulator, against the numpy
backend's attention. Not marked `gpu`: these run in CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err
from emulator import build, run

from app.engine.backend.base import AttentionMetadata
from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.attention import group_bucket

BLOCK = 16


@pytest.fixture(scope="module")
def decode_emu(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "attn_decode_main.cpp")


def _decode_case(rng, ctxs: list[int], heads: tuple[int, int, int]):
    """Paged caches in shuffled blocks holding each sequence's keys, and one query per sequence."""
    n_heads, n_kv, head_dim = heads
    per_seq = [max(1, -(-ctx // BLOCK)) for ctx in ctxs]
    order = rng.permutation(sum(per_seq) + 3)
    tables = np.zeros((len(ctxs), max(per_seq) + 2), np.int32)  # wider than needed, as a graph's are
    k_cache = np.zeros((len(order), BLOCK, n_kv, head_dim), np.float32)
    v_cache = np.zeros_like(k_cache)
    cpu, used = CpuBackend(), 0
    for i, ctx in enumerate(ctxs):
        tables[i, : per_seq[i]] = order[used : used + per_seq[i]]
        used += per_seq[i]
        slots = tables[i, np.arange(ctx) // BLOCK] * BLOCK + np.arange(ctx) % BLOCK
        k, v = (rng.standard_normal((ctx, n_kv, head_dim)).astype(np.float16).astype(np.float32) for _ in range(2))
        cpu.write_kv(k_cache, v_cache, k, v, slots)
    seq_lens = np.array(ctxs, np.int32)
    qsl = np.arange(len(ctxs) + 1, dtype=np.int32)
    q = rng.standard_normal((len(ctxs), n_heads, head_dim)).astype(np.float32)
    meta = AttentionMetadata(qsl, seq_lens, tables, np.zeros(len(q), np.int32), seq_lens - 1, 1,
                             int(seq_lens.max()), BLOCK, qsl, seq_lens)  # fmt: skip
    return q, k_cache, v_cache, meta


@pytest.mark.parametrize(("ctxs", "heads", "window", "cap", "blocks"), [
    ([1, 17, 300], (32, 8, 128), None, None, 8),  # 1 chunk, 1 chunk, 5 chunks over 5 blocks
    ([700, 5], (32, 8, 128), None, None, 3),  # 11 chunks looping over 3 blocks
    ([64, 65, 130], (16, 8, 128), None, None, 16),  # chunk edges; most blocks idle
    ([200, 90], (4, 1, 256), 100, None, 4),  # Gemma-like: head_dim 256, sliding window
    ([150, 33], (12, 4, 64), None, 5.0, 2),  # softcap, head_dim 64 (two threads per output dim)
    ([260, 1], (8, 1, 64), 40, None, 1),  # one block walks every chunk of a window
    ([129], (7, 1, 128), None, None, 4),  # a group of 7 in the 8-head variant
])  # fmt: skip
def test_attention_decode_emulated(decode_emu: Path, tmp_path: Path, ctxs, heads, window, cap, blocks) -> None:
    rng, seed = fresh_rng()
    q, k_cache, v_cache, meta = _decode_case(rng, ctxs, heads)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap)
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables)):
        a.tofile(tmp_path / f"{name}.bin")
    k_cache.astype(np.float16).tofile(tmp_path / "k.bin")
    v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
    run(decode_emu, tmp_path, head_dim, group_bucket(n_heads, n_kv), len(ctxs), n_heads, n_kv, BLOCK,
        meta.block_tables.shape[1], scale, cap or 0.0, window or 0, blocks)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"

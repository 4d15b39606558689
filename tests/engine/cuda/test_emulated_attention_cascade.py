"""A cascade decode (kernels/attention_cascade.py) on the SIMT emulator: a batch whose sequences share
the blocks at the head of their block tables, attended through attention_decode.cu over each one's own
keys (key floor, log-sum-exp out), attention_prefill.cu over the shared keys for the whole batch (key
limit) and the merge; against the numpy backend's attention over each whole context, and the decode
part alone against numpy over the own keys. Not marked `gpu`: these run in CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err, shared_prefix_case
from emulator import build, run

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.attention import group_bucket
from app.engine.kernels.attention_cascade import shared_length

pytestmark = pytest.mark.slow  # kernels run thread by thread on the CPU

BLOCK = 16
F16_TOL = 1e-3  # the shared part rounds q and the probabilities to float16 on the tensor cores


@pytest.fixture(scope="module", params=[(), ("-DPF_KEY_WARPS=1", "-DPF_VBUF=2", f"-DPF_BS={BLOCK}")],
                ids=["row-warps", "key-warps"])
def cascade_emu(request, tmp_path_factory) -> Path:
    """The shared part on attention_prefill.cu's default build, and on the one whose warps split each tile's keys
    (attention_prefill.KEY_WARPS: cascade_decode takes it up to PADDOCK_CASCADE_KEY_WARPS rows a KV head)."""
    return build(tmp_path_factory, "cascade_main.cpp", request.param)


def _own_part(q, k_cache, v_cache, meta, shared: int, scale: float, cap: float | None):
    """Attention of each row over keys [shared, position] only, and its natural-log sum of exponentials."""
    n_seqs, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[2]
    out = np.zeros_like(q, dtype=np.float64)
    lse = np.zeros((n_seqs, n_heads))
    for s in range(n_seqs):
        keys = np.arange(shared, meta.seq_lens[s])
        slots = meta.block_tables[s, keys // BLOCK] * BLOCK + keys % BLOCK
        k = k_cache.reshape(-1, n_kv, head_dim)[slots].astype(np.float64)
        v = v_cache.reshape(-1, n_kv, head_dim)[slots].astype(np.float64)
        for h in range(n_heads):
            g = h // (n_heads // n_kv)
            scores = k[:, g] @ q[s, h].astype(np.float64) * scale
            if cap:
                scores = cap * np.tanh(scores / cap)
            top = scores.max()
            weights = np.exp(scores - top)
            lse[s, h] = top + np.log(weights.sum())
            out[s, h] = weights @ v[:, g] / weights.sum()
    return out, lse


@pytest.mark.parametrize(("shared_blocks", "own", "heads", "cap", "blocks", "splits"), [
    (20, [5, 140, 1, 70], (32, 8, 128), None, 8, 4),  # Qwen3-8B: four sessions over 320 shared keys
    (9, [33, 2], (16, 8, 128), None, 3, 2),  # a shared part that ends inside a 64-key chunk
    (12, [1, 100, 17], (4, 1, 256), 30.0, 4, 3),  # head_dim 256 (Gemma's global layers), softcap
    (7, [40, 9, 64], (12, 4, 64), None, 2, 8),  # head_dim 64, group of 3, splits with no key at all
])  # fmt: skip
def test_cascade_decode_emulated(
    request: pytest.FixtureRequest,
    cascade_emu: Path,
    tmp_path: Path,
    shared_blocks,
    own,
    heads,
    cap,
    blocks,
    splits,
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = shared_prefix_case(rng, shared_blocks, own, heads, BLOCK)
    n_heads, n_kv, head_dim = heads
    shared = shared_length(meta.seq_lens, meta.block_tables, BLOCK)
    assert shared == shared_blocks * BLOCK  # every row has a key of its own past the shared blocks
    scale = head_dim**-0.5
    for name, a in (("q", q), ("seq_lens", meta.seq_lens), ("tables", meta.block_tables)):
        a.tofile(tmp_path / f"{name}.bin")
    k_cache.astype(np.float16).tofile(tmp_path / "k.bin")
    v_cache.astype(np.float16).tofile(tmp_path / "v.bin")
    run(cascade_emu, tmp_path, head_dim, group_bucket(n_heads, n_kv), len(own), n_heads, n_kv, BLOCK,
        meta.block_tables.shape[1], scale, cap or 0.0, blocks, splits, shared)  # fmt: skip

    own_ref, lse_ref = _own_part(q, k_cache, v_cache, meta, shared, scale, cap)
    own_got = np.fromfile(tmp_path / "own.bin", np.float32).reshape(q.shape)
    lse_got = np.fromfile(tmp_path / "lse.bin", np.float32).reshape(lse_ref.shape)
    assert rel_err(own_got, own_ref) < 1e-5, f"seed={seed}"
    assert np.abs(lse_got - lse_ref).max() < 1e-4, f"seed={seed}"
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, None, cap)
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"
    # attn_prefill_merge_h: the float32 output rounded to float16 as a cast rounds it, bit for bit
    got_h = np.fromfile(tmp_path / "out_h.bin", np.float16).reshape(ref.shape)
    np.testing.assert_array_equal(got_h, got.astype(np.float16))


def test_shared_length_takes_whole_common_blocks_before_each_newest_key() -> None:
    tables = np.array([[7, 3, 9, 4], [7, 3, 9, 5], [7, 3, 2, 6]], np.int32)
    assert shared_length(np.array([64, 64, 64]), tables, BLOCK) == 2 * BLOCK  # rows part after block 2
    assert shared_length(np.array([64, 64]), tables[:2], BLOCK) == 3 * BLOCK  # block 4 is not shared
    # A row whose newest key is the first of block 2: only blocks before it count.
    assert shared_length(np.array([33, 64]), tables[:2], BLOCK) == 2 * BLOCK
    assert shared_length(np.array([17, 64]), tables[:2], BLOCK) == BLOCK
    assert shared_length(np.array([16, 64]), tables[:2], BLOCK) == 0  # its only block holds its newest key
    assert shared_length(np.array([64]), tables[:1], BLOCK) == 0  # one sequence shares with nobody

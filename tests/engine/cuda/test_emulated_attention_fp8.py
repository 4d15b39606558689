"""The attention kernels' KV_FP8 builds (FP8 e4m3 caches with per-(block, KV head) scales) on the SIMT
emulator, against the numpy backend's attention over the same FP8 caches (fp8_kv.Fp8KvCache): the
same quantized values, so the float16 builds' tolerances. Not marked `gpu`: these run in CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import BLOCK as CASE_BLOCK
from cuda_samples import (
    attention_case,
    fp8_caches,
    fresh_rng,
    rel_err,
    shared_prefix_case,
    write_fp8_caches,
)
from emulator import build, run
from test_emulated_attention_cascade import BLOCK as CASCADE_BLOCK
from test_emulated_attention_cascade import _own_part
from test_emulated_attention_decode import BLOCK, _decode_case

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.attention import NO_SPLIT, group_bucket
from app.engine.kernels.attention_cascade import shared_length

pytestmark = pytest.mark.slow  # kernels run thread by thread on the CPU

FP8 = ("-DKV_FP8=1",)
F16_TOL = 1e-3  # the prefill kernel's: q and the probabilities rounded to float16 for the tensor cores


def _run_fp8(emu: Path, tmp_path: Path, q, k_cache, v_cache, meta, sinks, *args) -> np.ndarray:
    """The harness `emu` (built with KV_FP8=1) over these FP8 caches: its output, shaped as q."""
    for name, a in (("q", q), ("qsl", meta.query_start_loc), ("seq_lens", meta.seq_lens),
                    ("tables", meta.block_tables)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    if sinks is not None:
        sinks.tofile(tmp_path / "sinks.bin")
    write_fp8_caches(tmp_path, k_cache, v_cache)
    run(emu, tmp_path, *args)
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(q.shape)
    assert not np.isnan(got).any()
    return got


@pytest.fixture(scope="module", params=[(), ("-DDEC_PREFETCH=1",)], ids=["loop", "prefetch"])
def decode_fp8_emu(request, tmp_path_factory) -> Path:
    return build(tmp_path_factory, "attn_decode_main.cpp", (*FP8, *request.param))


@pytest.mark.parametrize(("ctxs", "heads", "window", "cap", "blocks", "sinks"), [
    ([1, 17, 300], (32, 8, 128), None, None, 8, False),  # 1 chunk, 1 chunk, 5 chunks over 5 blocks
    ([700, 5], (32, 8, 128), None, None, 3, False),  # chunks looping over 3 blocks (the scales' turns)
    ([200, 90], (4, 1, 256), 100, None, 4, False),  # head_dim 256, sliding window
    ([150, 33], (12, 4, 64), None, 5.0, 2, False),  # softcap (after the key's scale), head_dim 64
    ([129, 64], (64, 8, 64), None, None, 1, True),  # GPT-OSS: sinks, the one-block output path
])  # fmt: skip
def test_attention_decode_fp8_emulated(
    request: pytest.FixtureRequest, decode_fp8_emu: Path, tmp_path: Path, ctxs, heads, window, cap, blocks, sinks
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k32, v32, meta = _decode_case(rng, ctxs, heads)
    k_cache, v_cache = fp8_caches(rng, k32, v32)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    sink = rng.normal(0.0, 2.0, n_heads).astype(np.float32) if sinks else None
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap, sinks=sink)
    got = _run_fp8(decode_fp8_emu, tmp_path, q, k_cache, v_cache, meta, sink, head_dim, group_bucket(n_heads, n_kv),
                   len(ctxs), n_heads, n_kv, BLOCK, meta.block_tables.shape[1], scale, cap or 0.0, window or 0,
                   blocks)  # fmt: skip
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.fixture(scope="module", params=[(), ("-DPF_VBUF=2",)], ids=["vbuf1", "vbuf2"])
def prefill_fp8_emu(request, tmp_path_factory) -> Path:
    """The one-V-buffer build and PF_VBUF=2 (the next tile's V stored beside its K, synchronously here)."""
    return build(tmp_path_factory, "prefill_main.cpp", (*FP8, *request.param))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "sinks"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, False),  # group of 4, a chunk over a cached context
    ([(20, 20), (1, 40)], (4, 1, 256), None, None, 1, False),  # head_dim 256, a decode row beside a chunk
    ([(70, 513), (7, 300)], (12, 4, 64), 32, 5.0, 3, False),  # window, softcap, splits
    ([(70, 200), (1, 90)], (64, 8, 64), 128, None, 3, True),  # GPT-OSS's sliding layers: sinks in the merge
    ([(12, 40), (1, 20)], (8, 1, 512), None, 30.0, 2, False),  # Gemma 4's global heads: two value-column blocks
])  # fmt: skip
def test_attention_prefill_fp8_emulated(
    request: pytest.FixtureRequest, prefill_fp8_emu: Path, tmp_path: Path, seqs, heads, window, cap, splits, sinks
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k32, v32, meta = attention_case(rng, seqs, heads)
    k_cache, v_cache = fp8_caches(rng, k32, v32)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    sink = rng.normal(0.0, 2.0, n_heads).astype(np.float32) if sinks else None
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap, sinks=sink)
    got = _run_fp8(prefill_fp8_emu, tmp_path, q, k_cache, v_cache, meta, sink, head_dim, len(q), n_heads, n_kv,
                   CASE_BLOCK, len(seqs), meta.block_tables.shape[1], scale, cap or 0.0, window or 0,
                   splits)  # fmt: skip
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"


@pytest.fixture(scope="module")
def attention_fp8_emu(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "attention_main.cpp", FP8)


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits"), [
    ([(1, 1), (1, 17), (1, 300)], (32, 8, 128), None, None, None),  # decode rows, one split
    ([(5, 5), (1, 40)], (4, 1, 256), None, None, None),  # head_dim 256 (16-byte value loads)
    ([(1, 513), (7, 300), (1, 2)], (12, 4, 64), None, None, 3),  # splits and their merge
    ([(1, 70), (6, 60)], (8, 4, 128), 32, 5.0, None),  # window, softcap after the key's scale
    ([(1, 9), (1, 190)], (32, 2, 64), 40, None, 12),  # group of 16, mostly empty splits
    ([(1, 60), (4, 30)], (16, 2, 512), None, None, 2),  # Gemma 4's global heads (16-code value loads)
])  # fmt: skip
def test_attention_fp8_emulated(
    request: pytest.FixtureRequest, attention_fp8_emu: Path, tmp_path: Path, seqs, heads, window, cap, splits
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k32, v32, meta = attention_case(rng, seqs, heads)
    k_cache, v_cache = fp8_caches(rng, k32, v32)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap)
    n_splits, split_len = (1, NO_SPLIT) if splits is None else (splits, -(-meta.max_seq_len // splits))
    got = _run_fp8(attention_fp8_emu, tmp_path, q, k_cache, v_cache, meta, None, head_dim,
                   group_bucket(n_heads, n_kv), len(q), n_heads, n_kv, CASE_BLOCK, len(seqs),
                   meta.block_tables.shape[1], scale, cap or 0.0, window or 0, n_splits, split_len)  # fmt: skip
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.fixture(scope="module")
def cascade_fp8_emu(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "cascade_main.cpp", FP8)


@pytest.mark.parametrize(("shared_blocks", "own", "heads", "blocks", "splits"), [
    (20, [5, 140, 1, 70], (32, 8, 128), 8, 4),  # four sessions over 320 shared keys
    (7, [40, 9, 64], (12, 4, 64), 2, 8),  # head_dim 64, group of 3, splits with no key at all
])  # fmt: skip
def test_cascade_decode_fp8_emulated(
    request: pytest.FixtureRequest, cascade_fp8_emu: Path, tmp_path: Path, shared_blocks, own, heads, blocks, splits
) -> None:
    """A cascade decode (decode kernel from the key floor, prefill kernel up to the key limit, merge)
    over FP8 caches, against numpy's attention over the same caches; its decode part (each row's own
    keys) and log-sum-exp against numpy over the dequantized caches."""
    rng, seed = fresh_rng(request.node.nodeid)
    q, k32, v32, meta = shared_prefix_case(rng, shared_blocks, own, heads, CASCADE_BLOCK)
    # Gains up to 2^3 (not 2^6): the shared part's float16 q and probabilities err in proportion to the
    # scores, and 320 keys at 2^6 put it past F16_TOL (the exact decode part is checked below as well).
    k_cache, v_cache = fp8_caches(rng, k32, v32, spread=3)
    n_heads, n_kv, head_dim = heads
    shared = shared_length(meta.seq_lens, meta.block_tables, CASCADE_BLOCK)
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, None, None)
    got = _run_fp8(cascade_fp8_emu, tmp_path, q, k_cache, v_cache, meta, None, head_dim, group_bucket(n_heads, n_kv),
                   len(own), n_heads, n_kv, CASCADE_BLOCK, meta.block_tables.shape[1], scale, 0.0, blocks, splits,
                   shared)  # fmt: skip
    dequantized = [c.read(np.arange(c.data.shape[0])) for c in (k_cache, v_cache)]
    own_ref, lse_ref = _own_part(q, *dequantized, meta, shared, scale, None)
    own_got = np.fromfile(tmp_path / "own.bin", np.float32).reshape(q.shape)
    lse_got = np.fromfile(tmp_path / "lse.bin", np.float32).reshape(lse_ref.shape)
    assert rel_err(own_got, own_ref) < 1e-5, f"seed={seed}"
    assert np.abs(lse_got - lse_ref).max() < 1e-4, f"seed={seed}"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"

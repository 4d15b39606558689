"""attention_prefill.cu (tensor-core prefill attention) on the SIMT emulator, against numpy.

The emulator runs mma.sync and ldmatrix by their PTX fragment layouts (host/simt_emulator.h),
so tiling, the GQA row packing, masks, the online softmax and the split-KV merge are checked
without a GPU. q and the probabilities go through float16 on the way into the tensor cores,
hence a tolerance of float16 rounding rather than float32 reordering.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import BLOCK, attention_case, fresh_rng, rel_err, write_attention_case
from emulator import build as _build
from emulator import run as _run

from app.engine import envs
from app.engine.backend.cpu import CpuBackend
from app.engine.kernels import attention_prefill as ap
from app.engine.kernels.runtime.launch import LEAST_OPT_IN_SHARED_BYTES

pytestmark = pytest.mark.slow  # ~40 s: kernels run thread by thread on the CPU
F16_TOL = 1e-3  # q rounded to float16 (2^-11 relative) and P rounded before P @ V


@pytest.fixture(scope="module")
def prefill_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "prefill_main.cpp")


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),  # Qwen3/Llama-8B group of 4
    ([(20, 20), (1, 40)], (4, 1, 256), None, None, 1, 1.0),  # Gemma 3 270M shape, a decode row beside a chunk
    ([(70, 513), (7, 300)], (12, 4, 64), None, None, 3, 1.0),  # group of 3: tiles cut through a token's heads
    ([(50, 70), (6, 60)], (8, 4, 128), 32, 5.0, 1, 4.0),  # sliding window and softcap
    ([(30, 300), (3, 280)], (16, 2, 128), 100, None, 4, 1.0),  # group of 8, window with splits
    ([(64, 100)], (4, 1, 256), 40, None, 2, 1.0),  # head dim 256, window, splits
    ([(5, 5), (9, 200)], (8, 8, 64), None, None, 8, 1.0),  # many splits, some with no visible key
    # Gemma 4's global layers: 512-wide heads in two blocks of value columns, soft-capped, split
    ([(20, 20), (1, 40)], (8, 1, 512), None, 30.0, 1, 4.0),
    ([(24, 90), (3, 70)], (16, 2, 512), None, None, 3, 1.0),
])  # fmt: skip
def test_prefill_attention_emulated(
    request: pytest.FixtureRequest,
    prefill_emu: Path,
    tmp_path: Path,
    seqs,
    heads,
    window,
    cap,
    splits,
    q_scale,
):
    _check(request, prefill_emu, tmp_path, seqs, heads, window, cap, splits, q_scale)


def _check(request, emu: Path, tmp_path: Path, seqs, heads, window, cap, splits, q_scale) -> None:
    """A random case of `seqs` (new, total tokens) through harness `emu`, against the numpy backend."""
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = attention_case(rng, seqs, heads, q_scale)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap)
    write_attention_case(tmp_path, q, k_cache, v_cache, meta)
    _run(emu, tmp_path, head_dim, len(q), n_heads, n_kv, BLOCK, len(seqs), meta.block_tables.shape[1],
         scale, cap or 0.0, window or 0, splits)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"


@pytest.mark.parametrize(("seqs", "window", "splits"), [
    ([(40, 40), (3, 300)], None, 1),  # GPT-OSS's full layers: the sink at the kernel's own output
    ([(70, 200), (1, 90)], 128, 3),  # its sliding layers, split: the sink in the merge
])  # fmt: skip
def test_prefill_attention_sinks_emulated(
    request: pytest.FixtureRequest, prefill_emu: Path, tmp_path: Path, seqs, window, splits
) -> None:
    """GPT-OSS's attention sinks (64 heads of 64 over 8 KV heads) against numpy."""
    rng, seed = fresh_rng(request.node.nodeid)
    heads = (64, 8, 64)
    q, k_cache, v_cache, meta = attention_case(rng, seqs, heads, 1.0)
    n_heads, n_kv, head_dim = heads
    sinks = rng.normal(0.0, 2.0, n_heads).astype(np.float32)
    sinks[::7] += 12.0
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, None, sinks=sinks)
    assert rel_err(CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, None), ref) > 0.05
    write_attention_case(tmp_path, q, k_cache, v_cache, meta)
    sinks.tofile(tmp_path / "sinks.bin")
    _run(prefill_emu, tmp_path, head_dim, len(q), n_heads, n_kv, BLOCK, len(seqs), meta.block_tables.shape[1],
         scale, 0.0, window or 0, splits)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < F16_TOL, f"seed={seed}"


@pytest.fixture(scope="module")
def prefill_emu_lazy(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "prefill_main.cpp", ("-DPF_LAZY=8",))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),
    ([(70, 513), (7, 300)], (12, 4, 64), None, None, 3, 8.0),  # wide scores: maxima jump past 2^8 and not
    ([(50, 70), (6, 60)], (8, 4, 128), 32, 5.0, 1, 4.0),
])  # fmt: skip
def test_prefill_attention_lazy_rescale_emulated(
    request: pytest.FixtureRequest, prefill_emu_lazy: Path, tmp_path: Path, seqs, heads, window, cap, splits, q_scale
) -> None:
    """PF_LAZY=8: O rescaled only when a tile's max passes the row's running one by more than 2^8; the
    same attention, splits and their merge included."""
    _check(request, prefill_emu_lazy, tmp_path, seqs, heads, window, cap, splits, q_scale)


@pytest.fixture(scope="module", params=[(), ("-DPF_EARLY_KV=1",), (f"-DPF_BS={BLOCK}",)],
                ids=["wide", "wide-early-kv", "wide-block-size-built-in"])
def prefill_emu_wide(request, tmp_path_factory) -> Path:
    """The wide tile sm_80 and sm_90 run (64 keys, two V buffers); its A/B build that issues the next tile's K and
    V before this tile's products (PF_EARLY_KV); and the build with the cache's block size a constant (PF_BS, as
    attention_prefill.py builds every one)."""
    return _build(tmp_path_factory, "prefill_main.cpp", ("-DPF_VBUF=2", "-DPF_BN=64", *request.param))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),
    ([(8, 1000)], (32, 8, 128), None, None, 4, 1.0),  # a cascade's shared keys: 32 rows, four tiles a split
    ([(30, 300), (3, 280)], (16, 2, 128), 100, None, 4, 1.0),  # window with splits
    ([(5, 5), (9, 200)], (8, 8, 64), None, None, 8, 1.0),  # many splits, some with no visible key
])  # fmt: skip
def test_prefill_attention_wide_tile_emulated(
    request: pytest.FixtureRequest, prefill_emu_wide: Path, tmp_path: Path, seqs, heads, window, cap, splits, q_scale
) -> None:
    """The wide tile: the same attention, splits and their merge included."""
    _check(request, prefill_emu_wide, tmp_path, seqs, heads, window, cap, splits, q_scale)


@pytest.fixture(scope="module",
                params=[("-DPF_VBUF=2", f"-DPF_BS={BLOCK}"), ("-DPF_VBUF=1",), ("-DPF_VBUF=2", "-DPF_EARLY_KV=0")],
                ids=["key-warps", "key-warps-one-v-buffer", "key-warps-late-kv"])
def prefill_emu_key_warps(request, tmp_path_factory) -> Path:
    """The build whose warps share the block's rows and split each tile's keys (PF_KEY_WARPS: the cascade's shared
    part), as attention_prefill.py builds it (two V buffers, the next K and V issued early) and in its variants."""
    return _build(tmp_path_factory, "prefill_main.cpp", ("-DPF_KEY_WARPS=1", *request.param))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(8, 1000)], (32, 8, 128), None, None, 4, 1.0),  # a cascade's shared keys: 32 rows, four tiles a split
    ([(8, 1000)], (32, 8, 128), None, None, 1, 1.0),  # unsplit: the warps' combine writes the output itself
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),  # causal chunks: warps whose keys are all masked
    ([(50, 70), (6, 60)], (8, 4, 128), 32, 5.0, 1, 4.0),  # sliding window and softcap
    ([(30, 300), (3, 280)], (16, 2, 128), 100, None, 4, 1.0),  # window with splits
    ([(5, 5), (9, 200)], (8, 8, 64), None, None, 8, 1.0),  # many splits, some with no visible key
    ([(12, 90), (1, 40)], (4, 1, 256), None, 30.0, 3, 4.0),  # head dim 256: one row tile
    ([(24, 90), (3, 70)], (16, 2, 512), None, None, 3, 1.0),  # head dim 512: two blocks of value columns
])  # fmt: skip
def test_prefill_attention_key_warps_emulated(
    request: pytest.FixtureRequest, prefill_emu_key_warps: Path, tmp_path: Path, seqs, heads, window, cap, splits,
    q_scale,
) -> None:  # fmt: skip
    """The key-split build: the same attention, splits and their merge included."""
    _check(request, prefill_emu_key_warps, tmp_path, seqs, heads, window, cap, splits, q_scale)


def test_double_buffered_v_shared_bytes(monkeypatch) -> None:
    """attention_prefill.py counts PF_VBUF=2's second V buffer, and every head dim still fits where it did:
    256 in sm_86/89/120's 99 KB, 512 in sm_80's 163 KB."""
    sizes = {}
    try:
        for defines in ("", "PF_VBUF=2,PF_BN=64", "PF_VBUF=2"):
            monkeypatch.setenv("PADDOCK_KERNEL_DEFINES", defines)
            envs.reload()
            sizes[defines] = {d: ap.shared_bytes(d) for d in ap.HEAD_DIMS}
        assert ap.supports(256, 4, 1)  # PF_VBUF=2's 256 within every device's limit: no device asked
    finally:
        monkeypatch.delenv("PADDOCK_KERNEL_DEFINES")
        envs.reload()
    for d in ap.HEAD_DIMS:
        assert sizes["PF_VBUF=2"][d] == sizes[""][d] + ap.keys_per_tile(d) * (ap.value_columns(d) + ap.PAD) * 2
    assert sizes["PF_VBUF=2"][256] == LEAST_OPT_IN_SHARED_BYTES
    assert sizes["PF_VBUF=2"][512] == 163 * 1024
    assert sizes["PF_VBUF=2,PF_BN=64"][128] == 102 * 1024  # sm_80 and sm_90 only
    # the wide tile head dim 128 takes where it fits is that build: past the 99 KB every device has
    assert ap.shared_bytes(128, wide=True) == sizes["PF_VBUF=2,PF_BN=64"][128] > LEAST_OPT_IN_SHARED_BYTES
    assert ap.WIDE_TILE == {"PF_BN": 64, "PF_VBUF": 2}


@pytest.fixture(scope="module")
def prefill_emu_vbuf(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "prefill_main.cpp", ("-DPF_VBUF=2",))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),  # 300 keys: 10 tiles, the last one partial
    ([(70, 513), (7, 300)], (12, 4, 64), None, None, 2, 1.0),  # 9 tiles of 64 keys in 2 splits of 5 and 4
    ([(5, 5), (9, 200)], (8, 8, 64), None, None, 8, 1.0),  # splits of one tile, and of none
    ([(50, 70), (6, 60)], (8, 4, 128), 32, 5.0, 1, 4.0),  # sliding window and softcap
    ([(30, 600), (3, 580)], (16, 2, 128), 300, None, 3, 1.0),  # window with splits: 10 tiles in 4, 4, 2
    ([(64, 200)], (4, 1, 256), None, None, 1, 1.0),  # head dim 256: 7 tiles
    ([(8, 200)], (8, 1, 512), None, 30.0, 1, 4.0),  # 512: each value-column block's own 7 tiles
])  # fmt: skip
def test_prefill_attention_double_buffered_v_emulated(
    request: pytest.FixtureRequest, prefill_emu_vbuf: Path, tmp_path: Path, seqs, heads, window, cap, splits, q_scale
) -> None:
    """PF_VBUF=2: V a tile ahead in a second buffer like K, the barrier after P @ V gone; the same attention
    whichever buffer a tile lands in (a warp reading the other would take a stale or next tile's values)."""
    _check(request, prefill_emu_vbuf, tmp_path, seqs, heads, window, cap, splits, q_scale)


@pytest.fixture(scope="module")
def prefill_emu_vbuf_bn64(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "prefill_main.cpp", ("-DPF_VBUF=2", "-DPF_BN=64"))


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(40, 40), (17, 300)], (32, 8, 128), None, None, 1, 1.0),  # 5 tiles, the last one partial
    ([(50, 70), (6, 60)], (8, 4, 128), 32, 5.0, 1, 4.0),
    ([(30, 600), (3, 580)], (16, 2, 128), 300, None, 3, 1.0),  # 5 tiles in 2, 2, 1
    ([(64, 300)], (4, 1, 256), 200, None, 1, 1.0),
])  # fmt: skip
def test_prefill_attention_wide_tiles_emulated(
    request: pytest.FixtureRequest, prefill_emu_vbuf_bn64: Path, tmp_path: Path, seqs, heads, window, cap, splits,
    q_scale,
) -> None:  # fmt: skip
    """PF_BN=64 (with PF_VBUF=2): 64 keys a tile at head dims 128 and 256, S's n-tiles and P @ V's k-steps doubled."""
    _check(request, prefill_emu_vbuf_bn64, tmp_path, seqs, heads, window, cap, splits, q_scale)


@pytest.mark.parametrize(("optin_kb", "head_dim", "fp8", "wide"), [
    (227, 128, False, True), (163, 128, False, True),  # sm_90, sm_80
    (99, 128, False, False),  # sm_86 / 89 / 120: the narrow tile
    (227, 128, True, False), (227, 64, False, False), (227, 256, False, False),
])  # fmt: skip
def test_the_wide_tile_is_head_dim_128s_where_it_fits(monkeypatch, optin_kb, head_dim, fp8, wide) -> None:
    monkeypatch.setattr(ap, "max_shared_bytes", lambda: optin_kb * 1024)
    ap.wide_tile.cache_clear()
    try:
        assert ap.wide_tile(head_dim, fp8) is wide
    finally:
        ap.wide_tile.cache_clear()


def test_key_warp_build_bytes_and_where_the_cascade_takes_it(monkeypatch) -> None:
    """The key-split build (KEY_WARPS) as attention_prefill.py counts it: 32 rows (16 at head dim 256) and two
    64-key K and V buffers, or its warps' float32 (max, sum, O) of those rows at the end, whichever is more; the
    cascade takes it for at most `max_rows` rows a KV head within one of its row tiles, where its bytes fit the
    device."""
    from app.engine.kernels import attention_cascade as ac

    assert ap.rows_per_block(128, key_warps=True) == 32 and ap.rows_per_block(256, key_warps=True) == 16
    assert ap.keys_per_tile(64, key_warps=True) == ap.keys_per_tile(256, key_warps=True) == 64
    # head dim 128: Q (32 rows) + 2 K + 2 V buffers of 64 rows, 136 halves a row = 78,336 bytes; the combine 66,560
    assert ap.shared_bytes(128, key_warps=True) == (32 + 4 * 64) * 136 * 2
    # head dim 64: the tiles' 41,472 bytes are fewer than the combine's 4 warps x 32 rows x 66 floats
    assert ap.shared_bytes(64, key_warps=True) == max((32 + 4 * 64) * 72 * 2, 4 * 32 * 66 * 4)
    for optin_kb, fits_256 in ((99, False), (227, True)):
        monkeypatch.setattr(ap, "max_shared_bytes", lambda kb=optin_kb: kb * 1024)
        assert ap.key_warps_fit(128) and ap.key_warps_fit(256) is fits_256
        assert ac.key_warps(8, 32, 8, 128, 32)  # 8 sessions of Qwen3-8B: 32 rows
        assert not ac.key_warps(16, 32, 8, 128, 32)  # 64 rows: two row tiles would each read the keys
        assert not ac.key_warps(8, 32, 8, 128, 0)  # the switch off
        assert ac.key_warps(4, 32, 8, 256, 32) is fits_256  # 16 rows: one row tile of head dim 256
        assert not ac.key_warps(8, 32, 8, 256, 32)  # 32 rows would be two there

"""FP8 KV on the SIMT emulator: fp8_kv.cuh's codec against the numpy backend's (fp8_kv.py) over every
code and random floats, and kv_cache.cu's write_kv_fp8 against Fp8KvCache.write, byte for byte. Not
marked `gpu`: these run in CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng, rel_err, rope_tables
from emulator import build, run

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.fp8_kv import E4M3_VALUES, Fp8KvCache, encode_e4m3, pow2_scale


@pytest.fixture(scope="module")
def fp8_emu(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "fp8_main.cpp")


def _edge_floats() -> np.ndarray:
    """Every e4m3 value, the midpoints between neighbours (ties) and a float32 ulp either side of
    them, the saturation edge, zeros, infinities and float32 subnormals."""
    finite = np.unique(E4M3_VALUES[np.isfinite(E4M3_VALUES)])
    mids = (finite[:-1] + finite[1:]) / np.float32(2)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    special = np.array([448, 449, 464, 480, 1e6, np.inf, -np.inf, 0.0, -0.0, 2.0**-10, 2.0**-11, 1e-40, 2.0**-6],
                       np.float32)  # fmt: skip
    return np.concatenate([finite, mids, near, special]).astype(np.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # the NaN input
def test_codec_matches_the_numpy_encoder(request: pytest.FixtureRequest, fp8_emu: Path, tmp_path: Path) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    wide = rng.standard_normal(20000).astype(np.float32) * np.exp2(rng.integers(-14, 12, 20000)).astype(np.float32)
    x = np.concatenate([_edge_floats(), -_edge_floats(), wide, np.float32(np.nan) * np.ones(1, np.float32)])
    amax = np.abs(np.concatenate([x[np.isfinite(x)], rng.uniform(0, 1000, 5000).astype(np.float32)]))
    x.tofile(tmp_path / "x.bin")
    amax.tofile(tmp_path / "amax.bin")
    run(fp8_emu, "codec", tmp_path)
    enc = np.fromfile(tmp_path / "enc.bin", np.uint8)
    np.testing.assert_array_equal(enc, encode_e4m3(x), err_msg=f"seed={seed}")
    dec = np.fromfile(tmp_path / "dec.bin", np.float32)
    np.testing.assert_array_equal(dec, E4M3_VALUES)  # NaN where the table has NaN, bits otherwise
    half = np.fromfile(tmp_path / "half.bin", np.float16).astype(np.float32) * np.float32(256)
    finite = np.isfinite(E4M3_VALUES)
    np.testing.assert_array_equal(half[finite], E4M3_VALUES[finite])
    np.testing.assert_array_equal(np.fromfile(tmp_path / "scale.bin", np.float32), pow2_scale(amax))


def _write_case(rng, cache: Fp8KvCache, x_k, x_v, slots, tmp_path: Path, fp8_emu: Path) -> tuple[np.ndarray, ...]:
    """One write_kv_fp8 launch on copies of `cache`'s K and V arrays; returns (kd, ks, vd, vs)."""
    n_tok, n_kv, head_dim = x_k.shape
    for name, a in (("k", x_k), ("v", x_v), ("slots", slots.astype(np.int32))):
        a.tofile(tmp_path / f"{name}.bin")
    cache[0].data.tofile(tmp_path / "kd.bin")
    cache[0].scale.tofile(tmp_path / "ks.bin")
    cache[1].data.tofile(tmp_path / "vd.bin")
    cache[1].scale.tofile(tmp_path / "vs.bin")
    run(fp8_emu, "write", tmp_path, n_tok, n_kv, head_dim, cache[0].data.shape[1])
    return tuple(np.fromfile(tmp_path / f"{n}_out.bin", dt) for n, dt in
                 (("kd", np.uint8), ("ks", np.float32), ("vd", np.uint8), ("vs", np.float32)))  # fmt: skip


@pytest.mark.parametrize(("block", "n_kv", "head_dim"), [(16, 2, 64), (8, 1, 128)])
def test_write_kv_fp8_matches_the_numpy_cache(
    request: pytest.FixtureRequest, fp8_emu: Path, tmp_path: Path, block: int, n_kv: int, head_dim: int
) -> None:
    """A prefill chunk across blocks (one starts mid-block), then decode steps of two sequences whose
    values grow (the scale rises: the block is re-encoded), then a padding token; after each launch
    the emulated caches equal the numpy backend's, bytes and scales."""
    rng, seed = fresh_rng(request.node.nodeid)
    num_blocks = 8
    ref = [Fp8KvCache.zeros(num_blocks, block, n_kv, head_dim) for _ in range(2)]
    emu = [Fp8KvCache.zeros(num_blocks, block, n_kv, head_dim) for _ in range(2)]
    seq_a = np.array([3, 5, 1]) * block  # block table of sequence a: blocks 3, 5, 1
    seq_b = np.array([6]) * block
    steps = [
        np.concatenate([seq_a[0] + np.arange(block), seq_a[1] + np.arange(5)]),  # a: positions 0 .. block + 4
        np.concatenate([seq_b[0] + np.arange(3)]),  # b: positions 0 .. 2
        np.array([seq_a[1] + 5, seq_b[0] + 3]),  # one decode step of each
        np.array([seq_a[1] + 6, seq_b[0] + 4, -1]),  # louder values (scale rises), a padding token
        np.concatenate([seq_a[1] + np.arange(7, block), seq_a[2] + np.arange(2)]),
    ]
    for i, slots in enumerate(steps):
        loud = np.float32(8.0 ** (i == 3))
        x_k, x_v = (rng.standard_normal((len(slots), n_kv, head_dim)).astype(np.float32) * loud for _ in range(2))
        got = _write_case(rng, emu, x_k, x_v, slots, tmp_path, fp8_emu)
        keep = slots >= 0
        ref[0].write(x_k[keep], slots[keep])
        ref[1].write(x_v[keep], slots[keep])
        for arr, want in zip(got, (ref[0].data, ref[0].scale, ref[1].data, ref[1].scale), strict=True):
            np.testing.assert_array_equal(arr.reshape(want.shape), want, err_msg=f"step {i}, seed={seed}")
        emu[0].data[...], emu[0].scale[...] = got[0].reshape(emu[0].data.shape), got[1].reshape(emu[0].scale.shape)
        emu[1].data[...], emu[1].scale[...] = got[2].reshape(emu[1].data.shape), got[3].reshape(emu[1].scale.shape)
    assert (ref[0].scale[5] > ref[0].scale[3]).all(), "the loud step was meant to raise block 5's scales"


@pytest.mark.parametrize(("head_dim", "norm"), [(128, True), (64, False)])
def test_rope_cache_fp8_matches_numpy(
    request: pytest.FixtureRequest, fp8_emu: Path, tmp_path: Path, head_dim: int, norm: bool
) -> None:
    """rope_cache.cu's KV_FP8 build (float32 rows) then write_kv_fp8, as rope_cache.py runs them, against
    the numpy backend's rope_and_cache into an FP8 cache: q to float32 reordering, v byte for byte, the
    block scales equal, and k's codes within one e4m3 step (the rotation's float32 rounding may differ by
    an ulp, which can cross a rounding edge); a padding token stores nothing. 10 heads fill no whole number of
    rope_cache's blocks (4 heads of 128, 8 of 64 a block): the last block's empty slots write nothing."""
    rng, seed = fresh_rng(request.node.nodeid)
    cpu = CpuBackend()
    n_tok, n_heads, n_kv, block, max_pos = 20, 6, 2, 16, 64  # 10 heads: each token's last block part-empty
    table = cpu.rope_table(*rope_tables(head_dim, max_pos))
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    pos = np.arange(n_tok, dtype=np.int32)
    slots = (block + pos).astype(np.int32)  # one sequence from block 1's start into block 2
    slots[-1] = -1
    qn, kn = (rng.standard_normal(head_dim).astype(np.float32) for _ in range(2))
    emu = [Fp8KvCache.zeros(4, block, n_kv, head_dim) for _ in range(2)]
    for name, a in (("qkv", qkv), ("pos", pos), ("cos", table.cos), ("sin", table.sin), ("slots", slots),
                    ("qn", qn), ("kn", kn), ("kd", emu[0].data), ("ks", emu[0].scale), ("vd", emu[1].data),
                    ("vs", emu[1].scale)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    run(fp8_emu, "rope", tmp_path, n_tok, n_heads, n_kv, head_dim, 1e-6, max_pos, 0, int(norm), block)
    ref = cpu.alloc_kv_cache(4, block, n_kv, head_dim, "fp8")
    keep = slots >= 0
    q_ref = cpu.rope_and_cache(qkv[keep], n_heads, n_kv, head_dim, qn if norm else None, kn if norm else None, 1e-6,
                               pos[keep], table, False, *ref, slots[keep])  # fmt: skip
    q = np.fromfile(tmp_path / "q.bin", np.float32).reshape(n_tok, n_heads, head_dim)
    assert rel_err(q[keep], q_ref) < 1e-6, f"seed={seed}"
    kd, vd = (np.fromfile(tmp_path / f"{n}_out.bin", np.uint8).reshape(ref[0].data.shape) for n in ("kd", "vd"))
    ks, vs = (np.fromfile(tmp_path / f"{n}_out.bin", np.float32).reshape(ref[0].scale.shape) for n in ("ks", "vs"))
    np.testing.assert_array_equal(vd, ref[1].data)
    np.testing.assert_array_equal(vs, ref[1].scale)
    np.testing.assert_array_equal(ks, ref[0].scale)
    assert np.abs(kd.astype(np.int16) - ref[0].data.astype(np.int16)).max() <= 1, f"seed={seed}"
    assert (kd.reshape(-1, n_kv, head_dim)[[0, block + n_tok - 1]] == 0).all()  # block 0; the padding token's slot

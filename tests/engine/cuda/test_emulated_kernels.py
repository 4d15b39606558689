"""The CUDA kernels run on a CPU SIMT emulator (host/simt_emulator.h), against numpy.

Not marked `gpu`: these run in CI, on machines without a GPU. Every CUDA thread becomes a
host thread, with real barriers and warp shuffles, so indexing, reductions, splits and
the online softmax are checked before the kernels ever reach a device. Floating-point
details (FMA contraction, fast math) differ from the GPU; the GPU suite covers those.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import (
    BLOCK,
    attention_case,
    dequantize_oracle,
    fresh_rng,
    random_tensor,
    rel_err,
    write_attention_case,
)
from emulator import build as _build
from emulator import run as _run

from app.engine.backend.cpu import CpuBackend
from app.engine.kernels.attention import GROUP_BUCKETS, NO_SPLIT
from app.engine.kernels.gemv import VARIANTS

pytestmark = pytest.mark.slow  # ~1 min together: kernels run thread by thread on the CPU


@pytest.fixture(scope="module")
def kernels_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "kernels_main.cpp")


@pytest.fixture(scope="module")
def attention_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "attention_main.cpp")


@pytest.mark.parametrize(("qtype", "n_tok", "warps", "rows_per_block"), [
    ("Q4_K", 1, 2, 8), ("Q4_K", 1, 1, 4), ("Q6_K", 3, 1, 2), ("Q8_0", 8, 2, 2), ("Q5_0", 2, 1, 4), ("Q5_K", 1, 2, 8),
    ("Q4_1", 5, 2, 2), ("Q5_1", 1, 1, 4), ("Q4_0", 1, 1, 8), ("BF16", 1, 1, 8), ("F16", 2, 1, 4), ("F32", 4, 2, 2),
    ("MXFP4", 1, 2, 8), ("MXFP4", 3, 1, 2), ("IQ4_NL", 1, 1, 4), ("IQ4_NL", 8, 2, 2), ("IQ4_XS", 1, 2, 8),
    ("IQ4_XS", 2, 1, 4), ("NVFP4", 1, 2, 8), ("NVFP4", 5, 1, 2),
    ("F32", 1, 5, 1), ("Q4_K", 1, 2, 1), ("Q6_K", 1, 1, 1),  # a block per row: few-row products (few_rows_shape)
])  # fmt: skip
def test_gemv_emulated(
    request: pytest.FixtureRequest,
    kernels_emu: Path, tmp_path: Path, qtype: str, n_tok: int, warps: int, rows_per_block: int
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    rows, cols = 9, 1024
    tensor = random_tensor(qtype, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    tensor.data.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    bias.tofile(tmp_path / "bias.bin")
    bucket = next(b for b in VARIANTS if b >= n_tok)
    assert rows_per_block in VARIANTS[bucket]
    _run(kernels_emu, "gemv", qtype.lower(), bucket, rows_per_block, warps, tmp_path, rows, cols, n_tok,
         tensor.data.shape[1])  # fmt: skip
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, rows)
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T + bias
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize(("qtype", "out", "with_ids"), [
    ("Q4_K", "f16", False), ("Q6_K", "f32", True), ("Q8_0", "f16", False), ("Q5_0", "f32", False),
    ("Q5_K", "f16", True), ("BF16", "f32", True), ("F16", "f16", False),
    ("MXFP4", "f32", True), ("IQ4_NL", "f16", False), ("IQ4_XS", "f32", False), ("IQ4_XS", "f16", True),
    ("NVFP4", "f32", True), ("NVFP4", "f16", False),
])  # fmt: skip
def test_dequant_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, qtype: str, out: str, with_ids: bool
) -> None:
    """Rows to float32/float16 through the shared-memory tile, including a partial last block."""
    rng, seed = fresh_rng(request.node.nodeid)
    n_src, cols = 40, 768
    tensor = random_tensor(qtype, n_src, cols, rng)
    tensor.data.tofile(tmp_path / "w.bin")
    ref_all = dequantize_oracle(tensor)
    if with_ids:
        ids = rng.integers(0, n_src, 13).astype(np.int32)
        ids.tofile(tmp_path / "ids.bin")
        n_out, offset, ref = len(ids), 0, ref_all[ids]
    else:
        n_out, offset = 29, 7
        ref = ref_all[offset : offset + n_out]
    _run(
        kernels_emu, "dequant", qtype.lower(), out, tmp_path, n_src, cols, tensor.data.shape[1], n_out, offset
    )
    dtype = np.float32 if out == "f32" else np.float16
    got = np.fromfile(tmp_path / "y.bin", dtype).reshape(n_out, cols).astype(np.float32)
    assert not np.isnan(got).any(), f"seed={seed}"
    rtol = 1e-6 if out == "f32" else 1e-3
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-6, err_msg=f"seed={seed}")


@pytest.mark.parametrize(("cols", "add"), [(1000, True), (4096, True), (640, False), (5120, True)])
def test_rms_norm_half_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, cols: int, add: bool
) -> None:
    """The float16-out norm (what a product on the weights' float16 copy reads): the float32 norm's values
    cast to float16 exactly as a cast would round them, and the new residual as the float32 kernel's."""
    from app.engine.kernels.norm import vec_threads

    rng, seed = fresh_rng(request.node.nodeid)
    x, res = (rng.standard_normal((3, cols)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    for name, a in (("x", x), ("res", res), ("w", w)):
        a.tofile(tmp_path / f"{name}.bin")
    _run(kernels_emu, "add_rms_norm", tmp_path, 3, cols, 1e-6, vec_threads(cols), "half" if add else "half_noadd")
    cpu = CpuBackend()
    ref_y, ref_res = cpu.add_rms_norm(x, res, w, 1e-6) if add else (cpu.rms_norm(x, w, 1e-6), None)
    got = np.fromfile(tmp_path / "y.bin", np.float16).reshape(3, cols)
    # float32 values a few ulps apart (another summation order) may round to neighbouring halves
    np.testing.assert_allclose(got.astype(np.float32), ref_y.astype(np.float16).astype(np.float32), rtol=1e-3,
                               atol=1e-6, err_msg=f"seed={seed}")  # fmt: skip
    assert np.mean(got == ref_y.astype(np.float16)) > 0.99, f"seed={seed}"
    if add:
        np.testing.assert_array_equal(np.fromfile(tmp_path / "newres.bin", np.float32).reshape(3, cols), ref_res)


@pytest.mark.parametrize(("kind", "n_tok", "heads", "head_dim", "per_head"), [
    ("sigmoid", 1, 4, 64, False), ("sigmoid", 3, 2, 96, False), ("softplus", 2, 3, 32, False),
    ("softplus", 5, 4, 16, True),
])  # fmt: skip
def test_output_gate_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, kind: str, n_tok: int, heads: int,
    head_dim: int, per_head: bool,
) -> None:
    """The attention output gate reading its columns in place from a wider fused product's rows."""
    rng, seed = fresh_rng(request.node.nodeid)
    width = heads * head_dim
    cols = heads if per_head else width
    fused = (rng.standard_normal((n_tok, 3 * width + cols)) * 4).astype(np.float32)  # q/k/v, then the gate
    out = rng.standard_normal((n_tok, width)).astype(np.float32)
    out.tofile(tmp_path / "out.bin")
    np.concatenate([fused[:, 3 * width :], np.zeros((n_tok, 3 * width), np.float32)], axis=1).tofile(
        tmp_path / "gate.bin"
    )  # the gate's rows as wide as the fused product's
    _run(kernels_emu, "output_gate", kind, tmp_path, n_tok, width, 3 * width + cols, head_dim if per_head else 1)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, width)
    ref = CpuBackend().output_gate(out, fused[:, 3 * width :], kind)
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"


def test_gated_pairs_takes_four_elements_a_thread_where_rows_and_pointers_allow() -> None:
    from app.engine.kernels.activation import pairs_vector

    assert pairs_vector(12288, 0, 256) == 4
    assert pairs_vector(302, 0, 256) == 1  # a row's halves would split a 16-byte load
    assert pairs_vector(12288, 8, 256) == pairs_vector(12288, 0, 264) == 1  # unaligned input or output


# (f, vec): a width of no 4-element split on one element a thread; one of 4-element splits both ways
@pytest.mark.parametrize(("f", "vec"), [(302, 1), (300, 1), (300, 4)])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_pairs_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, kind: str, f: int, vec: int
) -> None:
    """act(gate) * up over gate and up side by side, as numpy computes it, one element or four a thread (the
    wrapper's grid); the float16 kernel writes exactly the float32 kernel's values rounded to nearest (what a
    cast gives: the down projection's input on its float16 copy)."""
    rng, seed = fresh_rng(request.node.nodeid)
    n_tok = 3
    gu = (rng.standard_normal((n_tok, 2 * f)) * 3).astype(np.float32)
    gu.tofile(tmp_path / "gu.bin")
    _run(kernels_emu, "gated_pairs", kind, "f32", tmp_path, n_tok, f, vec)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, f)
    assert rel_err(got, CpuBackend().gated_activation(gu[:, :f], gu[:, f:], kind)) < 1e-6, f"seed={seed}"
    _run(kernels_emu, "gated_pairs", kind, "f16", tmp_path, n_tok, f, vec)
    half = np.fromfile(tmp_path / "y.bin", np.float16).reshape(n_tok, f)
    np.testing.assert_array_equal(half, got.astype(np.float16), err_msg=f"seed={seed}")


@pytest.mark.parametrize(("cols", "vec"), [(1000, False), (1000, True), (4096, True), (640, True), (16384, True)])
def test_add_rms_norm_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, cols: int, vec: bool
) -> None:
    """The element-at-a-time kernel and the float4 one (as many threads as the wrapper gives it)."""
    from app.engine.kernels.norm import vec_threads

    rng, seed = fresh_rng(request.node.nodeid)
    x, res = (rng.standard_normal((3, cols)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    for name, a in (("x", x), ("res", res), ("w", w)):
        a.tofile(tmp_path / f"{name}.bin")
    extra = ("vec",) if vec else ()
    _run(kernels_emu, "add_rms_norm", tmp_path, 3, cols, 1e-6, vec_threads(cols) if vec else 256, *extra)
    ref_y, ref_res = CpuBackend().add_rms_norm(x, res, w, 1e-6)
    assert rel_err(np.fromfile(tmp_path / "y.bin", np.float32).reshape(3, cols), ref_y) < 1e-6, f"seed={seed}"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "newres.bin", np.float32).reshape(3, cols), ref_res)


@pytest.mark.parametrize(("cols", "scaled"), [(2816, True), (5376, True), (640, False), (16384, True)])
def test_rms_norm_join_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, cols: int, scaled: bool
) -> None:
    """Norm, the residual add and the layer scale in one launch (Gemma 4's post-norm): the numpy backend's
    three ops, bit for bit but for the norm's own reduction order."""
    from app.engine.kernels.norm import vec_threads

    rng, seed = fresh_rng(request.node.nodeid)
    x, join = (rng.standard_normal((3, cols)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(cols).astype(np.float32)
    scale = np.array([0.37], np.float32)
    for name, a in (("x", x), ("join", join), ("w", w), ("scale", scale)):
        a.tofile(tmp_path / f"{name}.bin")
    _run(kernels_emu, "rms_norm_join", tmp_path, 3, cols, 1e-6, vec_threads(cols), *(("scale",) if scaled else ()))
    ref = CpuBackend().rms_norm_join(x, w, 1e-6, join, scale if scaled else None)
    assert rel_err(np.fromfile(tmp_path / "y.bin", np.float32).reshape(3, cols), ref) < 1e-6, f"seed={seed}"


@pytest.mark.parametrize("cols", [2816, 640, 16384])
def test_rms_norm_pair_emulated(request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, cols: int) -> None:
    """One row norm under two weights (Gemma 4's router input and experts' input): both numpy norms."""
    from app.engine.kernels.norm import vec_threads

    rng, seed = fresh_rng(request.node.nodeid)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    w, w2 = np.ones(cols, np.float32), rng.standard_normal(cols).astype(np.float32)
    for name, a in (("x", x), ("w", w), ("w2", w2)):
        a.tofile(tmp_path / f"{name}.bin")
    _run(kernels_emu, "rms_norm_pair", tmp_path, 3, cols, 1e-6, vec_threads(cols))
    ref, ref2 = CpuBackend().rms_norm_pair(x, w, w2, 1e-6)
    for name, r in (("y", ref), ("y2", ref2)):
        got = np.fromfile(tmp_path / f"{name}.bin", np.float32).reshape(3, cols)
        assert rel_err(got, r) < 1e-6, f"{name} seed={seed}"


@pytest.mark.parametrize(("tokens", "heads", "cols", "before"), [(1, 16, 256, 32 * 256), (3, 4, 512, 48 * 512), (2, 2, 64, 96)])
def test_rms_norm_heads_emulated(
    request: pytest.FixtureRequest, kernels_emu: Path, tmp_path: Path, tokens: int, heads: int, cols: int, before: int
) -> None:
    """Gemma 4's value heads normalised where they lie in the q/k/v rows: the numpy backend's copy-out-and-back,
    every column outside them untouched."""
    from app.engine.kernels.norm import vec_threads

    rng, seed = fresh_rng(request.node.nodeid)
    width = before + heads * cols + 8  # columns after the heads too: the kernel must leave them
    x = rng.standard_normal((tokens, width)).astype(np.float32)
    w = np.ones(cols, np.float32)
    x.tofile(tmp_path / "x.bin")
    w.tofile(tmp_path / "w.bin")
    _run(kernels_emu, "rms_norm_heads", tmp_path, tokens, width, before, heads, cols, 1e-6, vec_threads(cols))
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(tokens, width)
    ref = CpuBackend().rms_norm_heads(x, before, heads, w, 1e-6)
    stop = before + heads * cols
    np.testing.assert_array_equal(np.delete(got, np.s_[before:stop], axis=1), np.delete(x, np.s_[before:stop], axis=1))
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"


@pytest.mark.parametrize(("seqs", "heads", "window", "cap", "splits", "q_scale"), [
    ([(1, 1), (1, 17), (1, 300)], (32, 8, 128), None, None, None, 1.0),
    ([(5, 5), (1, 40)], (4, 1, 256), None, None, None, 1.0),
    ([(1, 513), (7, 300), (1, 2)], (12, 4, 64), None, None, 3, 1.0),
    ([(1, 70), (6, 60)], (8, 4, 128), 32, 5.0, None, 4.0),
    ([(1, 300), (3, 280)], (16, 2, 128), 100, None, 4, 1.0),
    ([(1, 5), (1, 70), (1, 200), (1, 1)], (16, 8, 128), None, None, 16, 1.0),  # mostly empty splits, as in a decode graph
    ([(1, 9), (1, 190)], (8, 2, 64), 40, None, 12, 1.0),
    # the head sizes only this kernel runs: the tiny test models' 16 and 32, Gemma 4's 512-wide global heads
    ([(3, 20), (1, 70)], (4, 2, 16), 8, None, 3, 1.0),
    ([(6, 40), (1, 9)], (16, 1, 32), None, 30.0, None, 1.0),
    ([(1, 300), (1, 3)], (8, 1, 512), None, 30.0, 4, 1.0),
    ([(4, 40), (1, 12)], (4, 2, 512), 16, None, None, 1.0),
])  # fmt: skip
def test_attention_emulated(
    request: pytest.FixtureRequest,
    attention_emu: Path, tmp_path: Path, seqs, heads, window, cap, splits, q_scale
) -> None:
    rng, seed = fresh_rng(request.node.nodeid)
    q, k_cache, v_cache, meta = attention_case(rng, seqs, heads, q_scale)
    n_heads, n_kv, head_dim = heads
    scale = head_dim**-0.5
    ref = CpuBackend().attention(q, k_cache, v_cache, meta, scale, window, cap)
    gmax = next(g for g in GROUP_BUCKETS if g >= n_heads // n_kv)
    n_splits, split_len = (1, NO_SPLIT) if splits is None else (splits, -(-meta.max_seq_len // splits))
    write_attention_case(tmp_path, q, k_cache, v_cache, meta)
    _run(attention_emu, tmp_path, head_dim, gmax, len(q), n_heads, n_kv, BLOCK, len(seqs), meta.block_tables.shape[1],
         scale, cap or 0.0, window or 0, n_splits, split_len)  # fmt: skip
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(ref.shape)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.fixture(scope="module")
def fused_emu(tmp_path_factory) -> Path:
    return _build(tmp_path_factory, "fused_main.cpp")


# case -> (formats, token count): the combinations fused_main.cpp compiles (pick_multi / pick_gated).
MULTI_CASES = {0: (("Q4_K", "Q4_K", "Q6_K"), 1), 1: (("Q8_0", "Q5_1", "BF16"), 3), 2: (("Q6_K", "Q4_K"), 8)}
GATED_CASES = {
    0: (("Q4_K", "Q4_K"), 1, "silu"),
    1: (("Q6_K", "Q4_K"), 2, "gelu_tanh"),
    2: (("Q8_0", "Q8_0"), 6, "silu"),
}


@pytest.mark.parametrize(("case", "warps", "with_bias"), [(0, 1, False), (1, 2, True), (2, 1, True)])
def test_gemv_multi_emulated(
    request: pytest.FixtureRequest, fused_emu: Path, tmp_path: Path, case: int, warps: int, with_bias: bool
) -> None:
    """q/k/v (or any 2-3 weights) in one launch equals the stacked product, odd row counts included."""
    rng, seed = fresh_rng(request.node.nodeid)
    formats, n_tok = MULTI_CASES[case]
    cols = 512
    rows = [13, 6, 9][: len(formats)]
    tensors = [random_tensor(q, r, cols, rng) for q, r in zip(formats, rows, strict=True)]
    for i, t in enumerate(tensors):
        t.data.tofile(tmp_path / f"w{i}.bin")
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    total = sum(rows)
    bias = rng.standard_normal(total).astype(np.float32)
    if with_bias:
        bias.tofile(tmp_path / "bias.bin")
    padded_rows = [*rows, 0][:3]
    row_bytes = [t.data.shape[1] for t in tensors] + [tensors[-1].data.shape[1]] * (3 - len(tensors))
    _run(fused_emu, "multi", case, warps, tmp_path, cols, n_tok, *padded_rows, *row_bytes)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, total)
    w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    ref = x.astype(np.float64) @ w.T + (bias if with_bias else 0)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize(("case", "warps"), [(0, 1), (1, 2), (2, 1)])
def test_gemv_gated_emulated(
    request: pytest.FixtureRequest, fused_emu: Path, tmp_path: Path, case: int, warps: int
) -> None:
    """act(gate . x) * (up . x) in one launch, same and mixed formats, partial last block."""
    rng, seed = fresh_rng(request.node.nodeid)
    (fa, fb), n_tok, kind = GATED_CASES[case]
    rows, cols = 11, 768
    gate, up = random_tensor(fa, rows, cols, rng), random_tensor(fb, rows, cols, rng)
    gate.data.tofile(tmp_path / "wa.bin")
    up.data.tofile(tmp_path / "wb.bin")
    x = (
        rng.standard_normal((n_tok, cols)).astype(np.float32) * 0.02
    )  # gate ~ O(1): both sides of the activation
    x.tofile(tmp_path / "x.bin")
    _run(
        fused_emu,
        "gated",
        case,
        warps,
        tmp_path,
        rows,
        cols,
        n_tok,
        gate.data.shape[1],
        up.data.shape[1],
        kind,
    )
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(n_tok, rows)
    x64 = x.astype(np.float64)
    g = (x64 @ dequantize_oracle(gate).astype(np.float64).T).astype(np.float32)
    u = (x64 @ dequantize_oracle(up).astype(np.float64).T).astype(np.float32)
    ref = CpuBackend().gated_activation(g, u, kind)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert rel_err(got, ref) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize(("head_dim", "rotary", "interleaved"), [(64, 64, False), (128, 32, False), (64, 16, True)])
def test_rope_emulated(
    request: pytest.FixtureRequest, fused_emu: Path, tmp_path: Path, head_dim: int, rotary: int, interleaved: bool
) -> None:
    """rope.cu, whole-head and partial (the first `rotary` dims turn, the rest are copied), equals numpy's."""
    rng, seed = fresh_rng(request.node.nodeid)
    cpu = CpuBackend()
    n_tok, n_heads, max_pos = 3, 5, 50
    angles = np.arange(max_pos)[:, None] * (1.0 / (10000.0 ** (np.arange(0, rotary, 2) / rotary)))[None, :]
    table = cpu.rope_table(np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    x = rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, max_pos, n_tok).astype(np.int32)
    for name, a in (("x", x), ("pos", pos), ("cos", table.cos), ("sin", table.sin)):
        a.tofile(tmp_path / f"{name}.bin")
    _run(fused_emu, "rope", tmp_path, n_tok, n_heads, head_dim, max_pos, int(interleaved), 64)
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(x.shape)
    ref = cpu.rope(x, pos, table, interleaved)
    assert rel_err(got, ref) < 1e-6, f"seed={seed}"
    np.testing.assert_array_equal(got[..., rotary:], x[..., rotary:])


# A block holds heads_per_block(head_dim) heads of a token (8 of 64, 4 of 128, 2 of 256, 1 of 512); heads
# (n_heads + 2 n_kv) not a multiple of it leave the last block part empty.
@pytest.mark.parametrize(("head_dim", "interleaved", "norm", "rotary", "n_heads", "n_kv"), [
    (64, True, True, 64, 4, 2), (128, False, True, 128, 4, 2), (256, False, False, 256, 4, 2),
    (512, False, True, 512, 4, 2),
    (256, False, True, 64, 4, 2), (64, False, False, 16, 4, 2), (128, True, True, 32, 4, 2),  # partial RoPE
    (512, True, True, 128, 4, 2),  # partial at the widest head (256 threads)
    (128, False, True, 128, 2, 2), (128, False, False, 128, 2, 2),  # 6 heads: the second block half empty
    (64, False, True, 64, 3, 1), (64, True, False, 64, 10, 2),  # 5 of 8 heads; 14: q, k and v in one block
    (256, True, True, 256, 3, 1), (256, False, False, 128, 3, 1),  # 5 heads of 256: the last block half empty
])  # fmt: skip
def test_rope_cache_emulated(
    request: pytest.FixtureRequest,
    fused_emu: Path, tmp_path: Path, head_dim: int, interleaved: bool, norm: bool, rotary: int, n_heads: int,
    n_kv: int,
) -> None:  # fmt: skip
    """QK-norm + RoPE + KV write in one launch equals the numpy composition; padding slots untouched.
    With a table of fewer than head_dim / 2 frequencies only the first `rotary` dims turn (the norm
    still spans the head). Several heads share a block (rope_cache.heads_per_block), each with its own
    sum of squares; heads past the last in a token's last block write nothing."""
    rng, seed = fresh_rng(request.node.nodeid)
    cpu = CpuBackend()
    n_tok, block, n_blocks, max_pos = 5, 16, 3, 300
    inv = 1.0 / (10000.0 ** (np.arange(0, rotary, 2) / rotary))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    table = cpu.rope_table(np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    qkv = rng.standard_normal((n_tok, (n_heads + 2 * n_kv) * head_dim)).astype(np.float32)
    pos = rng.integers(0, max_pos, n_tok).astype(np.int32)
    slots = rng.choice(n_blocks * block, n_tok, replace=False).astype(np.int32)
    slots[2] = -1  # a padding token: q computed, nothing cached
    qn, kn = (rng.standard_normal(head_dim).astype(np.float32) for _ in range(2))
    for name, a in (("qkv", qkv), ("pos", pos), ("cos", table.cos), ("sin", table.sin), ("slots", slots),
                    ("qn", qn), ("kn", kn)):  # fmt: skip
        a.tofile(tmp_path / f"{name}.bin")
    _run(fused_emu, "rope_cache", tmp_path, n_tok, n_heads, n_kv, head_dim, 1e-6, max_pos, int(interleaved),
         int(norm), n_blocks * block)  # fmt: skip
    k_ref, v_ref = cpu.alloc_kv_cache(n_blocks, block, n_kv, head_dim)
    kept = slots >= 0
    q_ref = cpu.rope_and_cache(
        qkv[kept], n_heads, n_kv, head_dim, qn if norm else None, kn if norm else None, 1e-6, pos[kept], table,
        interleaved, k_ref, v_ref, slots[kept],
    )  # fmt: skip
    q = np.fromfile(tmp_path / "q.bin", np.float32).reshape(n_tok, n_heads, head_dim)
    k = np.fromfile(tmp_path / "k.bin", np.float16).reshape(-1, n_kv, head_dim)
    v = np.fromfile(tmp_path / "v.bin", np.float16).reshape(-1, n_kv, head_dim)
    assert not np.isnan(q).any(), f"seed={seed}"
    assert rel_err(q[kept], q_ref) < 1e-6, f"seed={seed}"
    written = slots[kept]
    np.testing.assert_allclose(k[written], k_ref.reshape(-1, n_kv, head_dim)[written], rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(v[written], v_ref.reshape(-1, n_kv, head_dim)[written].astype(np.float16))
    untouched = np.setdiff1d(np.arange(n_blocks * block), written)
    assert np.isnan(k[untouched].astype(np.float32)).all() and np.isnan(v[untouched].astype(np.float32)).all()

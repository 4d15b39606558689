"""gemv_int.cu's kernels (x as int16 codes, integer dot products) on the SIMT emulator.

Not marked `gpu`: these run in CI. The reference is the float64 product with the numpy
dequantizers' weights and the exact x; the kernels round x to 16-bit codes per 16 columns
(|error| <= max|x| / 65534 per value), so they are held to a relative error of 3e-4 (inputs with outliers) where
the float32-x kernels are held to 1e-5. A wrong index or scale is off by far more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cuda_samples import (
    INT_X_TOL,
    dequantize_oracle,
    fresh_rng,
    gated_term_err,
    random_tensor,
    rel_err,
    term_err,
)
from emulator import build, run

from app.engine.backend.cpu import CpuBackend


@pytest.fixture(scope="module")
def int_emu(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "int_main.cpp")


@pytest.fixture(scope="module")
def int_emu_qb2(tmp_path_factory) -> Path:
    """The build whose threads load two 16-column groups of x at once (XQ_QB=2, as gemv_int.py asks
    for wide x)."""
    return build(tmp_path_factory, "int_main.cpp", ("-DXQ_QB=2",))


def _x(rng: np.random.Generator, cols: int, scale: float = 1.0) -> np.ndarray:
    x = rng.standard_normal(cols).astype(np.float32) * np.float32(scale)
    x[rng.integers(0, cols, 3)] *= 40.0  # outliers, as real activations have: each costs its group precision
    x[:16] = 0.0  # an all-zero group: its scale is 0 and must not divide by it
    return x


@pytest.mark.parametrize(("qtype", "rows_per_warp", "units", "warps", "grid", "cols"), [
    ("Q4_K", 2, 2, 2, 2, 1024), ("Q4_K", 1, 1, 1, 3, 768), ("Q4_K", 1, 2, 1, 3, 768), ("Q6_K", 2, 2, 2, 1, 1024),
    ("Q6_K", 4, 1, 1, 2, 512), ("Q5_K", 1, 2, 2, 1, 768), ("Q8_0", 1, 1, 2, 2, 640), ("Q4_0", 2, 2, 1, 5, 640),
    ("Q4_1", 4, 1, 1, 1, 1024), ("Q5_0", 1, 2, 2, 4, 512), ("Q5_1", 2, 2, 1, 3, 1024),
])  # fmt: skip
def test_gemv_int_emulated(
    request: pytest.FixtureRequest,
    int_emu: Path,
    tmp_path: Path,
    qtype: str,
    rows_per_warp: int,
    units: int,
    warps: int,
    grid: int,
    cols: int,
) -> None:
    """Every integer format, one or two units per lane step; fewer blocks than row groups, so
    warps loop; a partial last group."""
    rng, seed = fresh_rng(request.node.nodeid)
    rows = 13
    tensor = random_tensor(qtype, rows, cols, rng)
    x, bias = _x(rng, cols), rng.standard_normal(rows).astype(np.float32)
    tensor.data.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    bias.tofile(tmp_path / "bias.bin")
    run(
        int_emu,
        "single",
        qtype.lower(),
        rows_per_warp,
        units,
        warps,
        grid,
        tmp_path,
        rows,
        cols,
        tensor.data.shape[1],
    )
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    w = dequantize_oracle(tensor)
    ref = w.astype(np.float64) @ x.astype(np.float64) + bias
    assert not np.isnan(got).any(), f"seed={seed}"
    assert term_err(got, ref, w, x) < INT_X_TOL, f"seed={seed}"


# case -> formats: the combinations int_main.cpp compiles (pick_multi / pick_gated).
MULTI_CASES = {0: ("Q4_K", "Q4_K", "Q6_K"), 1: ("Q8_0", "Q5_1", "Q4_0")}
GATED_CASES = {0: (("Q4_K", "Q4_K"), "silu"), 1: (("Q6_K", "Q5_K"), "gelu_tanh")}


@pytest.mark.parametrize(("case", "warps", "grid", "with_bias"), [(0, 2, 3, True), (1, 1, 2, False)])
def test_gemv_int_multi_emulated(
    request: pytest.FixtureRequest,
    int_emu: Path, tmp_path: Path, case: int, warps: int, grid: int, with_bias: bool
) -> None:
    """q/k/v in one launch equals the stacked product; a block's warps cross weight boundaries."""
    rng, seed = fresh_rng(request.node.nodeid)
    cols, rows = 512, [13, 6, 9]
    tensors = [random_tensor(q, r, cols, rng) for q, r in zip(MULTI_CASES[case], rows, strict=True)]
    for i, t in enumerate(tensors):
        t.data.tofile(tmp_path / f"w{i}.bin")
    x = _x(rng, cols)
    x.tofile(tmp_path / "x.bin")
    bias = rng.standard_normal(sum(rows)).astype(np.float32)
    if with_bias:
        bias.tofile(tmp_path / "bias.bin")
    run(int_emu, "multi", case, warps, grid, tmp_path, cols, *rows, *(t.data.shape[1] for t in tensors))
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    ref = w @ x.astype(np.float64) + (bias if with_bias else 0)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert term_err(got, ref, w, x) < INT_X_TOL, f"seed={seed}"


@pytest.mark.parametrize(("case", "warps", "grid"), [(0, 2, 2), (1, 1, 3)])
def test_gemv_int_gated_emulated(
    request: pytest.FixtureRequest, int_emu: Path, tmp_path: Path, case: int, warps: int, grid: int
) -> None:
    """act(gate . x) * (up . x) in one launch, same and mixed formats, a partial last group."""
    rng, seed = fresh_rng(request.node.nodeid)
    (fa, fb), kind = GATED_CASES[case]
    rows, cols = 11, 768
    gate, up = random_tensor(fa, rows, cols, rng), random_tensor(fb, rows, cols, rng)
    gate.data.tofile(tmp_path / "wa.bin")
    up.data.tofile(tmp_path / "wb.bin")
    x = _x(rng, cols, 0.02)  # gate ~ O(1): both sides of the activation
    x.tofile(tmp_path / "x.bin")
    run(int_emu, "gated", case, warps, grid, tmp_path, rows, cols, gate.data.shape[1], up.data.shape[1], kind)
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    assert not np.isnan(got).any(), f"seed={seed}"
    assert gated_term_err(got, dequantize_oracle(gate), dequantize_oracle(up), x, kind) < INT_X_TOL, f"seed={seed}"


@pytest.mark.parametrize(("kind", "with_residual"), [("single", True), ("multi", True), ("multi", False), ("gated", True)])
def test_gemv_int_fused_norm_emulated(
    request: pytest.FixtureRequest, int_emu: Path, tmp_path: Path, kind: str, with_residual: bool
) -> None:
    """With a norm weight, the prologue adds the residual and RMS-normalizes x first: the product
    of add_rms_norm's output, and block 0 writes the new residual (bit for bit x + res)."""
    rng, seed = fresh_rng(request.node.nodeid)
    cols, eps = 768, 1e-6
    x = _x(rng, cols)
    res = rng.standard_normal(cols).astype(np.float32) * np.float32(3.0)
    nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    nw.tofile(tmp_path / "nw.bin")
    if with_residual:
        res.tofile(tmp_path / "res.bin")
        normed, new_res = CpuBackend().add_rms_norm(x[None], res[None], nw, eps)
    else:
        normed, new_res = CpuBackend().rms_norm(x[None], nw, eps), x[None]
    x64 = normed[0].astype(np.float64)
    if kind == "single":
        tensor = random_tensor("Q4_K", 13, cols, rng)
        tensor.data.tofile(tmp_path / "w.bin")
        run(int_emu, "single", "q4_k", 2, 2, 2, 3, tmp_path, 13, cols, tensor.data.shape[1])
        ref = dequantize_oracle(tensor).astype(np.float64) @ x64
    elif kind == "multi":
        tensors = [random_tensor(q, r, cols, rng) for q, r in zip(MULTI_CASES[0], (13, 6, 9), strict=True)]
        for i, t in enumerate(tensors):
            t.data.tofile(tmp_path / f"w{i}.bin")
        run(int_emu, "multi", 0, 2, 3, tmp_path, cols, 13, 6, 9, *(t.data.shape[1] for t in tensors))
        ref = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64) @ x64
    else:
        gate, up = random_tensor("Q4_K", 11, cols, rng), random_tensor("Q4_K", 11, cols, rng)
        gate.data.tofile(tmp_path / "wa.bin")
        up.data.tofile(tmp_path / "wb.bin")
        run(int_emu, "gated", 0, 2, 2, tmp_path, 11, cols, gate.data.shape[1], up.data.shape[1], "silu")
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    assert not np.isnan(got).any(), f"seed={seed}"
    if kind == "gated":
        err = gated_term_err(got, dequantize_oracle(gate), dequantize_oracle(up), normed[0], "silu")
    else:
        err = rel_err(got, ref)
    assert err < INT_X_TOL, f"seed={seed}"
    np.testing.assert_array_equal(np.fromfile(tmp_path / "newres.bin", np.float32), new_res[0])


@pytest.mark.parametrize("kind", ["single", "multi", "gated"])
def test_gemv_int_two_groups_per_thread_emulated(
    request: pytest.FixtureRequest, int_emu_qb2: Path, tmp_path: Path, kind: str
) -> None:
    """XQ_QB=2: each thread quantizes two groups of x, the second only where it exists (768 columns
    over 32 threads: 48 groups, so half the threads take one); a Q6_K weight beside Q4_K ones gets
    its own layout from the same quantized groups."""
    rng, seed = fresh_rng(request.node.nodeid)
    cols = 768
    x = _x(rng, cols, 0.02 if kind == "gated" else 1.0)
    x.tofile(tmp_path / "x.bin")
    if kind == "single":
        tensor = random_tensor("Q6_K", 13, cols, rng)
        tensor.data.tofile(tmp_path / "w.bin")
        run(int_emu_qb2, "single", "q6_k", 2, 2, 1, 3, tmp_path, 13, cols, tensor.data.shape[1])
        w = dequantize_oracle(tensor)
        err = term_err(np.fromfile(tmp_path / "y.bin", np.float32), w.astype(np.float64) @ x, w, x)
    elif kind == "multi":
        tensors = [random_tensor(q, r, cols, rng) for q, r in zip(MULTI_CASES[0], (13, 6, 9), strict=True)]
        for i, t in enumerate(tensors):
            t.data.tofile(tmp_path / f"w{i}.bin")
        run(int_emu_qb2, "multi", 0, 1, 3, tmp_path, cols, 13, 6, 9, *(t.data.shape[1] for t in tensors))
        w = np.concatenate([dequantize_oracle(t) for t in tensors])
        err = term_err(np.fromfile(tmp_path / "y.bin", np.float32), w.astype(np.float64) @ x, w, x)
    else:
        (fa, fb), act = GATED_CASES[1]
        gate, up = random_tensor(fa, 11, cols, rng), random_tensor(fb, 11, cols, rng)
        gate.data.tofile(tmp_path / "wa.bin")
        up.data.tofile(tmp_path / "wb.bin")
        run(int_emu_qb2, "gated", 1, 1, 2, tmp_path, 11, cols, gate.data.shape[1], up.data.shape[1], act)
        got = np.fromfile(tmp_path / "y.bin", np.float32)
        err = gated_term_err(got, dequantize_oracle(gate), dequantize_oracle(up), x, act)
    assert err < INT_X_TOL, f"seed={seed}"


def test_gemv_int_past_the_default_shared_memory_emulated(
    request: pytest.FixtureRequest, int_emu_qb2: Path, tmp_path: Path
) -> None:
    """A 31B-class down product (21,504 columns: 54 KB of quantized x, past the 48 KB a block has without
    opting in) now takes this kernel (gemv_int.serves; the launch raises the function's shared memory):
    the kernel's x staging and its dot products hold at that width, two groups a thread as gemv_int.py
    builds it."""
    from app.engine.kernels import gemv_int
    from app.engine.kernels.runtime.launch import DEFAULT_SHARED_BYTES

    rng, seed = fresh_rng(request.node.nodeid)
    rows, cols = 5, 21504
    assert gemv_int.shared_bytes(cols, ("Q6_K",)) > DEFAULT_SHARED_BYTES
    tensor = random_tensor("Q6_K", rows, cols, rng)
    assert gemv_int.serves(1, cols, ("Q6_K",), gemv_int.MIN_BYTES)
    x = _x(rng, cols)
    tensor.data.tofile(tmp_path / "w.bin")
    x.tofile(tmp_path / "x.bin")
    run(int_emu_qb2, "single", "q6_k", 1, 2, 8, 2, tmp_path, rows, cols, tensor.data.shape[1])
    w = dequantize_oracle(tensor)
    got = np.fromfile(tmp_path / "y.bin", np.float32)
    assert term_err(got, w.astype(np.float64) @ x.astype(np.float64), w, x) < INT_X_TOL, f"seed={seed}"

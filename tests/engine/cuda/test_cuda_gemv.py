"""Quantized GEMV kernels against the numpy dequantizers, every format, odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import (
    ALL_QTYPES,
    GEMV_TOL,
    dequantize_oracle,
    gemv_tol,
    linear_tol,
    random_tensor,
    rel_err,
    term_err,
)

from app.engine.kernels import gemv_int
from app.engine.kernels.gemv import gemv

pytestmark = pytest.mark.gpu

K_QUANTS = {"Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "NVFP4"}  # blocks wider than 32 weights
# (rows, cols): one row, odd row counts (partial last block of rows), several units per lane.
SHAPES = [(1, 256), (37, 512), (130, 768), (257, 2816)]
SMALL_BLOCK_SHAPES = [(20, 640), (3, 96)]  # Gemma-like widths that are not whole 256-blocks
TOKENS = [1, 2, 3, 5, 8]


def _shapes(qtype: str) -> list[tuple[int, int]]:
    return SHAPES if qtype in K_QUANTS else SHAPES + SMALL_BLOCK_SHAPES


CASES = [(q, s) for q in ALL_QTYPES for s in _shapes(q)]


@pytest.mark.parametrize("n_tok", TOKENS)
@pytest.mark.parametrize(("qtype", "shape"), CASES)
def test_gemv_matches_oracle(cuda, rng, qtype: str, shape: tuple[int, int], n_tok: int) -> None:
    import cupy

    rows, cols = shape
    tensor = random_tensor(qtype, rows, cols, rng)
    ref_w = dequantize_oracle(tensor).astype(np.float64)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32) if n_tok % 2 else None
    weight = cuda.load_weight(tensor)
    out = cupy.full((n_tok, rows), cupy.nan, cupy.float32)  # poisoned: every element must be written
    gemv(weight.data, qtype, weight.row_bytes, rows, cols, cupy.asarray(x), out,
         None if bias is None else cupy.asarray(bias))  # fmt: skip
    got = cupy.asnumpy(out)
    ref = x.astype(np.float64) @ ref_w.T + (0 if bias is None else bias)
    assert not np.isnan(got).any(), "unwritten or NaN outputs"
    # With one or three rows, an output that cancels to near zero (random Q5_K blocks reach
    # 15,000x) would make the plain relative error meaningless: see term_err.
    assert term_err(got, ref, ref_w, x) < gemv_tol(n_tok, cols, [qtype], tensor.data.nbytes)


@pytest.mark.parametrize("warps", [1, 2, 8])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_1"])
def test_gemv_any_block_width(cuda, rng, qtype: str, warps: int) -> None:
    """The result does not depend on how many warps split a row."""
    import cupy

    rows, cols = 19, 2048
    tensor = random_tensor(qtype, rows, cols, rng)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    weight = cuda.load_weight(tensor)
    out = cupy.full((3, rows), cupy.nan, cupy.float32)
    gemv(weight.data, qtype, weight.row_bytes, rows, cols, cupy.asarray(x), out, warps=warps)
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    assert rel_err(cupy.asnumpy(out), ref) < GEMV_TOL


@pytest.mark.parametrize("rows_per_block", [4, 8, 1])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_gemv_single_token_variants(cuda, rng, qtype: str, rows_per_block: int) -> None:
    import cupy

    rows, cols = 21, 4096
    tensor = random_tensor(qtype, rows, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    weight = cuda.load_weight(tensor)
    out = cupy.full((1, rows), cupy.nan, cupy.float32)
    gemv(
        weight.data, qtype, weight.row_bytes, rows, cols, cupy.asarray(x), out, rows_per_block=rows_per_block
    )
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    assert rel_err(cupy.asnumpy(out), ref) < GEMV_TOL


@pytest.mark.parametrize(
    ("rows_per_warp", "warps", "blocks_per_sm", "units"),
    [(1, 1, 1, 1), (2, 4, 4, 2), (4, 8, 16, 1), (1, 8, 4, 2)],
)
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_K"])
def test_gemv_int_launch_shapes(
    cuda, rng, qtype: str, rows_per_warp: int, warps: int, blocks_per_sm: int, units: int
) -> None:
    """The int16-x kernel at every launch shape the benchmark tries, with warps looping over row groups."""
    import cupy

    rows, cols = 4099, 4096
    tensor = random_tensor(qtype, rows, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    weight = cuda.load_weight(tensor)
    out = cupy.full((1, rows), cupy.nan, cupy.float32)
    gemv_int.gemv_int(weight.data, qtype, weight.row_bytes, rows, cols, cupy.asarray(x), out, None,
                      rows_per_warp, warps, blocks_per_sm, units)  # fmt: skip
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    got = cupy.asnumpy(out)
    assert not np.isnan(got).any(), "unwritten or NaN outputs"
    assert rel_err(got, ref) < linear_tol(1, cols, [qtype], tensor.data.nbytes)

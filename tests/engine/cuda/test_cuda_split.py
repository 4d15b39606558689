"""The split formats (FP8, NVFP4, MXFP4 safetensors layouts) on the GPU, against the numpy oracle.

gemv_split.cu's GEMV and dequantize kernels directly, then the CUDA backend's `linear` (GEMV up to
8 tokens, cuBLAS on expanded float16 rows above) and `embedding` (the gather) over the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import F16_TOL, GEMV_TOL, SPLIT_KINDS, random_split_tensor, rel_err

from app.engine.kernels.gemv_split import dequant_split_rows, gemv_split

pytestmark = pytest.mark.gpu

SHAPES = [(1, 256), (37, 384), (300, 1024), (129, 4096)]


@pytest.mark.parametrize("n_tok", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_gemv_split_matches_oracle(cuda, rng, kind: str, shape: tuple[int, int], n_tok: int) -> None:
    import cupy

    rows, cols = shape
    tensor = random_split_tensor(kind, rows, cols, rng)
    weight = cuda.load_weight(tensor)
    assert weight.split and weight.data.nbytes >= tensor.data.nbytes  # the file's codes, as stored
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32) if n_tok % 2 else None
    out = cupy.full((n_tok, rows), cupy.nan, cupy.float32)
    gemv_split(weight.data, weight.scales, weight.layout, rows, cols, cupy.asarray(x), out,
               None if bias is None else cupy.asarray(bias))  # fmt: skip
    ref = x.astype(np.float64) @ tensor.dequantize().astype(np.float64).T + (0 if bias is None else bias)
    got = cupy.asnumpy(out)
    assert not np.isnan(got).any()
    assert rel_err(got, ref) < GEMV_TOL


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_dequant_split_matches_oracle(cuda, rng, kind: str, out_dtype: str) -> None:
    import cupy

    rows, cols = 300, 512
    tensor = random_split_tensor(kind, rows, cols, rng)
    weight = cuda.load_weight(tensor)
    ids = rng.integers(0, rows, 17).astype(np.int32)
    out = cupy.empty((len(ids), cols), out_dtype)
    dequant_split_rows(weight.data, weight.scales, weight.layout, rows, cols, out, cupy.asarray(ids))
    got = cupy.asnumpy(out).astype(np.float32)
    ref = tensor.dequantize(rows=ids)
    if out_dtype == "float32":
        np.testing.assert_array_equal(got, ref)  # the same float32 products as the oracle
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-6)
    sliced = cupy.empty((50, cols), out_dtype)
    dequant_split_rows(weight.data, weight.scales, weight.layout, rows, cols, sliced, row_offset=100)
    np.testing.assert_allclose(cupy.asnumpy(sliced).astype(np.float32), tensor.dequantize()[100:150], rtol=1e-3,
                               atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("n_tok", [1, 4, 8, 40])
@pytest.mark.parametrize("kind", SPLIT_KINDS)
def test_backend_linear_and_embedding_on_split_weights(cuda, cpu, rng, kind: str, n_tok: int) -> None:
    import cupy

    rows, cols = 260, 768
    tensor = random_split_tensor(kind, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    got = cupy.asnumpy(cuda.linear(cupy.asarray(x), cuda.load_weight(tensor)))
    ref = cpu.linear(x, cpu.load_weight(tensor))
    # From DENSE_FROM_TOKENS tokens a weight with a float16 copy (the dense cache's choice) goes to cuBLAS.
    assert rel_err(got, ref) < (GEMV_TOL if n_tok <= 2 else F16_TOL)
    ids = rng.integers(0, rows, 9)
    np.testing.assert_array_equal(
        cupy.asnumpy(cuda.embedding(cuda.load_weight(tensor), ids)), tensor.dequantize(rows=ids)
    )

"""Embedding gather and whole-tensor expansion against the numpy dequantizers."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import ALL_QTYPES, dequantize_oracle, random_tensor

from app.engine.kernels.dequant import dequant_rows

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qtype", ALL_QTYPES)
def test_embedding_rows_match_oracle(cuda, rng, qtype: str) -> None:
    rows, cols = 301, 512
    tensor = random_tensor(qtype, rows, cols, rng)
    ids = rng.integers(0, rows, 23).astype(np.int32)
    ids[:3] = [0, rows - 1, ids[5]]  # both ends and a repeat
    got = cuda.to_host(cuda.embedding(cuda.load_weight(tensor), cuda.from_host(ids)))
    ref = dequantize_oracle(tensor)[ids]
    assert got.dtype == np.float32 and got.shape == (23, cols)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)  # float32 rounding order


@pytest.mark.parametrize("qtype", ALL_QTYPES)
def test_dequant_to_f16_matches_oracle(cuda, rng, qtype: str) -> None:
    import cupy

    rows, cols = 77, 768
    tensor = random_tensor(qtype, rows, cols, rng)
    weight = cuda.load_weight(tensor)
    out = cupy.full((rows - 10, cols), cupy.nan, cupy.float16)
    dequant_rows(weight.data, qtype, weight.row_bytes, rows, cols, out, row_offset=10)
    ref = dequantize_oracle(tensor)[10:]
    got = cupy.asnumpy(out).astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-6)  # one float16 rounding


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0"])
def test_vectors_load_as_float32(cuda, rng, qtype: str) -> None:
    from app.engine.quant.dispatch import QuantizedTensor

    tensor = random_tensor(qtype, 1, 640, rng)
    vector = QuantizedTensor("norm", tensor.qtype, (640,), tensor.data)
    got = cuda.to_host(cuda.load_weight(vector))
    assert got.shape == (640,) and got.dtype == np.float32
    np.testing.assert_allclose(got, dequantize_oracle(tensor)[0], rtol=1e-5, atol=1e-6)

"""gemv_mma.cu on the GPU (off by default in `linear`, see gemv_mma.py): every format, stacked
weights, partial tiles, against the float64 product of the numpy dequantizers' weights."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, random_tensor, rel_err

from app.engine.kernels.gemv_mma import FORMATS as MMA_FORMATS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n_tok", [2, 7, 8, 16, 33, 64])
@pytest.mark.parametrize("qtype", sorted(MMA_FORMATS))
def test_gemv_mma_matches_oracle(cuda, rng, qtype: str, n_tok: int) -> None:
    import cupy

    from app.engine.kernels.gemv_mma import gemv_mma

    cols = 768 if qtype.endswith("_K") else 608  # 608: the last 128-column step is partial
    rows = (45, 19)
    tensors = [random_tensor(qtype, r, cols, rng) for r in rows]
    weights = [cuda.load_weight(t) for t in tensors]
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(sum(rows)).astype(np.float32)
    out = cupy.full((n_tok, sum(rows)), cupy.nan, cupy.float32)
    parts = [(w.data, qtype, w.row_bytes, w.n_rows) for w in weights]
    got = cupy.asnumpy(gemv_mma(parts, cols, cupy.asarray(x), out, cupy.asarray(bias)))
    ref_w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    ref = x.astype(np.float64) @ ref_w.T + bias
    assert not np.isnan(got).any(), "unwritten outputs"
    assert rel_err(got, ref) < F16_TOL

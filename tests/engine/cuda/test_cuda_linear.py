"""`CudaBackend.linear`: the GEMV path for decode; from 3 tokens cuBLAS on the float16 weight
cache ("auto"; Q4_K up to 16 tokens on gemv_mma still), or without a copy ("off") gemv_mma up to 64 tokens
and slices dequantized per call above."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, linear_tol, random_tensor, rel_err

from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["auto", "off"])
def backend(request, cuda):
    from app.engine.backend.cuda.backend import CudaBackend

    return CudaBackend(dense_cache=request.param)


@pytest.mark.parametrize("n_tok", [1, 4, 8, 9, 32, 64, 300])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1", "F16", "BF16", "F32"])
def test_linear_matches_oracle(backend, rng, qtype: str, n_tok: int) -> None:
    cuda = backend
    rows, cols = 333, 1024
    tensor = random_tensor(qtype, rows, cols, rng)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    weight = cuda.load_weight(tensor)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), weight, cuda.from_host(bias)))
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T + bias
    assert got.shape == (n_tok, rows) and got.dtype == np.float32
    assert not np.isnan(got).any()
    dense = getattr(weight, "dense16", None) is not None
    assert rel_err(got, ref) < linear_tol(n_tok, cols, [qtype], tensor.data.nbytes, dense)


def test_linear_prefill_slices_large_matrices(cuda, rng, monkeypatch) -> None:
    """Several scratch slices (forced small) give the same result as one."""
    from app.engine.backend.cuda import linear as cuda_linear
    from app.engine.backend.cuda.backend import CudaBackend

    cuda = CudaBackend(dense_cache="off")  # the per-call dequantization is what slices
    monkeypatch.setattr(cuda_linear, "SCRATCH_ELEMENTS", 300 * 512)
    tensor = random_tensor("Q4_K", 1000, 512, rng)
    x = rng.standard_normal((17, 512)).astype(np.float32)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), cuda.load_weight(tensor)))
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    assert rel_err(got, ref) < F16_TOL


@pytest.mark.parametrize("n_tok", [65, 150])
def test_linear_without_a_copy_slices_tokens_over_gemv_mma(cuda, rng, n_tok: int) -> None:
    """With the plan's no-copy bound raised past gemv_mma's 64 tokens, a product is cut into launches of 64
    rows (fused q/k/v-like parts and a bias included) and equals the float64 product within float16's error."""
    from app.engine.backend.cuda.backend import CudaBackend
    from app.engine.kernels.options import KernelOptions

    cuda = CudaBackend(dense_cache="off", kernel_options=KernelOptions(gemv_mma_no_copy=256))
    tensors = [random_tensor(q, rows, 512, rng) for q, rows in (("Q4_K", 200), ("Q6_K", 64), ("Q8_0", 64))]
    fused = cuda.fuse_linear([cuda.load_weight(t) for t in tensors], [None] * 3)
    x = rng.standard_normal((n_tok, 512)).astype(np.float32)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), fused))
    ref = x.astype(np.float64) @ np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64).T
    assert got.shape == ref.shape and rel_err(got, ref) < F16_TOL


@pytest.mark.parametrize("n_tok", [1, 20])
def test_linear_dense_fallback_for_odd_widths(cuda, rng, n_tok: int) -> None:
    """Float matrices whose rows are not whole 32-weight units are served dense."""
    values = rng.standard_normal((50, 100)).astype(np.float32)
    tensor = QuantizedTensor("odd", QUANT_TYPES["F32"], (50, 100), values.view(np.uint8).reshape(50, -1))
    weight = cuda.load_weight(tensor)
    assert weight.dense is not None
    x = rng.standard_normal((n_tok, 100)).astype(np.float32)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), weight))
    assert rel_err(got, x.astype(np.float64) @ values.T.astype(np.float64)) < 1e-5


@pytest.mark.parametrize(("qtype", "rows", "cols"), [
    ("Q4_K", 4096, 4096), ("Q6_K", 4096, 4096), ("Q8_0", 4096, 4096), ("Q6_K", 1024, 21504), ("Q4_K", 1024, 21504),
])  # fmt: skip
def test_linear_large_single_token_takes_int_x(cuda, rng, qtype: str, rows: int, cols: int) -> None:
    """One token over a weight of the 8B shapes runs gemv_int.cu (int16 x), within its bound; so does a
    31B-class down product, whose 21,504 columns of quantized x need more than the default 48 KB of
    shared memory (the launch opts in)."""
    from app.engine.kernels import gemv_int

    tensor = random_tensor(qtype, rows, cols, rng)
    assert cuda.gemv_plan.int_x and gemv_int.serves(1, cols, [qtype], tensor.data.nbytes)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    got = cuda.to_host(cuda.linear(cuda.from_host(x), cuda.load_weight(tensor)))
    ref = x.astype(np.float64) @ dequantize_oracle(tensor).astype(np.float64).T
    assert not np.isnan(got).any()
    assert rel_err(got, ref) < linear_tol(1, cols, [qtype], tensor.data.nbytes)

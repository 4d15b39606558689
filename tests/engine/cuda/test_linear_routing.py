"""Which path `linear` on CUDA gives a product (backend/cuda/linear.py), decided on the host: no GPU needed.

A weight without a float16 copy must not be expanded to float16 on every decode step of 3..64 sequences:
those products go to gemv_mma.cu, in launches of at most its MAX_TOKENS rows."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.cuda import linear as cuda_linear
from app.engine.backend.cuda.weights import CudaFusedWeight, CudaWeight
from app.engine.kernels import gemv_mma
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.quant.types import QUANT_TYPES

TOKENS = (1, 2, 3, 8, 9, 32, 64, 65, 200)


def _weight(qtype: str = "Q4_K", rows: int = 512, cols: int = 1024, copy: bool = False) -> CudaWeight:
    q = QUANT_TYPES[qtype]
    row_bytes = cols // q.block_size * q.type_size
    return CudaWeight(
        f"w.{qtype}", q, (rows, cols), row_bytes, data=object(), dense16=object() if copy else None
    )


def _served(weight: CudaWeight | CudaFusedWeight, plan: GemvPlan) -> list[int]:
    return [n for n in TOKENS if cuda_linear._mma_parts(n, weight, plan) is not None]


def test_products_on_weights_without_a_copy_take_the_tensor_cores_from_three_tokens() -> None:
    plan = GemvPlan()
    assert _served(_weight(), plan) == [3, 8, 9, 32, 64]
    assert _served(_weight("Q6_K"), plan) == [3, 8, 9, 32, 64]
    # With a float16 copy cuBLAS reads it, but for Q4_K's products of up to 16 tokens (gemv_plan.MMA_COPY).
    assert _served(_weight("Q6_K", copy=True), plan) == []
    assert _served(_weight(copy=True), plan) == [3, 8, 9]
    assert _served(_weight(copy=True), GemvPlan(mma_copy={})) == []
    # Formats gemv_mma cannot decode keep their paths.
    assert _served(_weight("IQ4_XS"), plan) == []


def test_the_plan_bounds_the_products() -> None:
    assert _served(_weight(), GemvPlan(mma_max_tokens=0, mma_no_copy=0)) == []
    assert _served(_weight(), GemvPlan(mma_max_tokens=0, mma_no_copy=8)) == [3, 8]
    assert _served(_weight(), GemvPlan(mma_no_copy=200)) == [3, 8, 9, 32, 64, 65, 200]
    assert _served(_weight(copy=True), GemvPlan(mma_max_tokens=16, mma_copy={})) == [3, 8, 9]
    assert _served(_weight(copy=True), GemvPlan(mma_max_tokens=64)) == [3, 8, 9, 32, 64]


def test_a_format_bound_sends_weights_with_a_copy_to_gemv_mma() -> None:
    """plan.mma_copy: where decoding a format's blocks beats reading the float16 copy (Q4_K, not Q6_K)."""
    plan = GemvPlan(mma_copy={"Q4_K": 16})
    assert _served(_weight(copy=True), plan) == [3, 8, 9]
    assert _served(_weight("Q6_K", copy=True), plan) == []
    assert _served(_weight(copy=True), GemvPlan(mma_copy={"Q4_K": 16}, mma_max_tokens=32)) == [3, 8, 9, 32]
    # A fused weight takes the least bound of its parts' formats: a Q6_K v beside Q4_K q and k keeps the copy.
    q4 = (_weight(rows=256), _weight(rows=64))
    assert _served(CudaFusedWeight(q4, dense16=object()), plan) == [3, 8, 9]
    assert _served(CudaFusedWeight((*q4, _weight("Q6_K", rows=64)), dense16=object()), plan) == []
    # Without a copy the no-copy bound still rules.
    assert _served(_weight(), plan) == [3, 8, 9, 32, 64]


def test_a_tall_weight_with_a_format_bound_takes_gemv_mma_further() -> None:
    """plan.mma_copy_tall: a weight of MMA_TALL_ROWS rows or more (a fused gate/up) whose formats have a copy bound
    takes gemv_mma up to the larger of the two; a narrower one, or a format without a bound, does not."""
    from app.engine.kernels.gemv_plan import MMA_TALL_ROWS

    plan = GemvPlan(mma_copy={"Q4_K": 16}, mma_copy_tall=32)
    half = MMA_TALL_ROWS // 2
    gate_up = CudaFusedWeight((_weight(rows=half), _weight(rows=half)), dense16=object())
    assert _served(gate_up, plan) == [3, 8, 9, 32]
    assert _served(_weight(rows=MMA_TALL_ROWS, copy=True), plan) == [3, 8, 9, 32]
    assert _served(_weight(rows=MMA_TALL_ROWS - 1, copy=True), plan) == [3, 8, 9]
    assert _served(_weight("Q6_K", rows=MMA_TALL_ROWS, copy=True), plan) == []
    assert _served(gate_up, GemvPlan(mma_copy={"Q4_K": 16}, mma_copy_tall=0)) == [3, 8, 9]
    assert _served(gate_up, GemvPlan(mma_copy={}, mma_copy_tall=32)) == []


def test_takes_half_where_the_product_reads_float16() -> None:
    """takes_half: a single weight whose product of these tokens runs on float16 x (its copy, its rows expanded
    past the GEMV sizes, or gemv_mma2, whose pre-pass would round x to float16); never a fused weight, a float32
    matrix, gemv_mma.cu (v1) or the GEMVs."""
    plan = GemvPlan(mma_copy={"Q4_K": 16}, mma_kernel="v1")
    assert [n for n in TOKENS if cuda_linear.takes_half(n, _weight(copy=True), plan)] == [32, 64, 65, 200]
    assert [n for n in TOKENS if cuda_linear.takes_half(n, _weight("Q6_K", copy=True), plan)] == [3, 8, 9, 32, 64, 65, 200]
    past_gemv = [n for n in TOKENS if n > cuda_linear.GEMV_MAX_TOKENS]
    assert [n for n in TOKENS if cuda_linear.takes_half(n, _weight(), plan)] == [n for n in past_gemv if n > 64]
    assert not cuda_linear.takes_half(32, CudaFusedWeight((_weight(copy=True),), dense16=object()), plan)
    assert not cuda_linear.takes_half(0, _weight(copy=True), plan)
    # gemv_mma2 (the default): every product from DENSE_FROM_TOKENS reads float16, on the GEMV sizes' side too
    v2 = GemvPlan(mma_copy={"Q4_K": 16})
    assert v2.mma_kernel == "v2"
    for weight in (_weight(copy=True), _weight("Q6_K", copy=True), _weight()):
        assert [n for n in TOKENS if cuda_linear.takes_half(n, weight, v2)] == [3, 8, 9, 32, 64, 65, 200]
    assert not cuda_linear.takes_half(3, _weight(), GemvPlan(mma_no_copy=0))  # the GEMVs at 3 tokens: float32 x


def test_fused_weights_follow_their_own_copy() -> None:
    parts = (_weight(rows=256), _weight(rows=64), _weight("Q6_K", rows=64))
    assert _served(CudaFusedWeight(parts), GemvPlan()) == [3, 8, 9, 32, 64]
    assert _served(CudaFusedWeight(parts, dense16=object()), GemvPlan()) == []  # its Q6_K part keeps the copy
    # gemv_mma takes at most three weights in a launch: four parts go their own ways.
    assert _served(CudaFusedWeight((*parts, _weight(rows=32))), GemvPlan()) == []


@pytest.mark.parametrize("n_tok", [3, 64, 65, 150])
def test_products_over_more_rows_than_a_launch_takes_are_sliced(monkeypatch, n_tok: int) -> None:
    """_gemv_mma cuts x and out into launches of MAX_TOKENS rows that cover every row once."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    calls: list[int] = []

    def fake(parts, n_cols, x, out, bias=None, shape=None, kernel="v1", max_splits=8):  # the contract, on numpy
        assert 1 <= x.shape[0] <= gemv_mma.MAX_TOKENS and out.flags.c_contiguous and kernel == "v2"
        assert max_splits == 4  # the plan's cap on the column splits
        calls.append(x.shape[0])
        out[...] = x @ w.T + (0 if bias is None else bias)
        return out

    monkeypatch.setattr(gemv_mma, "gemv_mma", fake)
    x = rng.standard_normal((n_tok, 64)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    out = np.full((n_tok, 48), np.nan, np.float32)
    cuda_linear._gemv_mma([(None, "Q4_K", 0, 48)], 64, x, out, bias, GemvPlan(mma_kernel="v2", mma_splits=4))
    assert sum(calls) == n_tok and len(calls) == -(-n_tok // gemv_mma.MAX_TOKENS)
    np.testing.assert_allclose(out, x @ w.T + bias, rtol=1e-5, atol=1e-5)

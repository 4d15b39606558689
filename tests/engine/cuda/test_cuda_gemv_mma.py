"""gemv_mma.cu ("v1") and gemv_mma2.cu ("v2") on the GPU (off by default in `linear`, see
gemv_mma.py): every format, stacked weights, partial tiles, v2's column splits and launch shapes,
against the float64 product of the numpy dequantizers' weights. Outputs start as NaN: every one
must be written (v2 with splits zeroes them in its pre-pass and adds into them)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import F16_TOL, dequantize_oracle, random_tensor, rel_err

from app.engine.kernels.gemv_mma import FORMATS as MMA_FORMATS
from app.engine.kernels.gemv_mma import KERNELS, MmaShape, pick_shape

pytestmark = pytest.mark.gpu


def _check(cuda, rng, formats, rows, cols: int, n_tok: int, kernel: str, shape: MmaShape | None = None) -> None:
    import cupy

    from app.engine.kernels.gemv_mma import gemv_mma

    tensors = [random_tensor(q, r, cols, rng) for q, r in zip(formats, rows, strict=True)]
    weights = [cuda.load_weight(t) for t in tensors]
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    bias = rng.standard_normal(sum(rows)).astype(np.float32)
    out = cupy.full((n_tok, sum(rows)), cupy.nan, cupy.float32)
    parts = [(w.data, q, w.row_bytes, w.n_rows) for w, q in zip(weights, formats, strict=True)]
    got = cupy.asnumpy(gemv_mma(parts, cols, cupy.asarray(x), out, cupy.asarray(bias), shape=shape, kernel=kernel))
    ref_w = np.concatenate([dequantize_oracle(t) for t in tensors]).astype(np.float64)
    ref = x.astype(np.float64) @ ref_w.T + bias
    assert not np.isnan(got).any(), "unwritten outputs"
    assert rel_err(got, ref) < F16_TOL


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_tok", [2, 7, 8, 16, 33, 64])
@pytest.mark.parametrize("qtype", sorted(MMA_FORMATS))
def test_gemv_mma_matches_oracle(cuda, rng, qtype: str, n_tok: int, kernel: str) -> None:
    cols = 768 if qtype.endswith("_K") else 608  # 608: the last 128-column step is partial
    _check(cuda, rng, (qtype, qtype), (45, 19), cols, n_tok, kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n_tok", [3, 9, 33, 64])
def test_gemv_mma_q4_k_m_qkv_with_splits(cuda, rng, n_tok: int, kernel: str) -> None:
    """q/k/v as Q4_K_M stores them (v in Q6_K), few rows and 4096 columns: v2 splits the columns."""
    rows, cols = (160, 32, 40), 4096
    if kernel == "v2":
        assert pick_shape(n_tok, sum(rows), cols, "v2").k_splits > 1
    _check(cuda, rng, ("Q4_K", "Q4_K", "Q6_K"), rows, cols, n_tok, kernel)


@pytest.mark.parametrize(("m_tiles", "n_tiles", "col_warps", "row_warps", "splits", "n_tok"), [
    (1, 1, 2, 4, 1, 5),
    (1, 1, 4, 2, 3, 8),  # three splits of uneven length
    (2, 2, 1, 4, 2, 12),
    (1, 4, 2, 4, 1, 30),
    (2, 8, 1, 4, 4, 64),  # the 249-register build, two blocks a multiprocessor
    (2, 8, 1, 2, 1, 41),
    (2, 4, 2, 2, 2, 25),
])  # fmt: skip
@pytest.mark.parametrize("formats", [("Q4_K", "Q6_K"), ("Q8_0", "Q5_K")])
def test_gemv_mma2_launch_shapes(
    cuda, rng, formats, m_tiles: int, n_tiles: int, col_warps: int, row_warps: int, splits: int, n_tok: int
) -> None:  # fmt: skip
    shape = MmaShape(m_tiles, n_tiles, col_warps, row_warps, splits)
    _check(cuda, rng, formats, (200, 77), 2560, n_tok, "v2", shape)


@pytest.mark.parametrize(("m_tiles", "n_tiles", "col_warps", "splits", "n_tok"), [
    (1, 1, 2, 2, 6),
    (1, 1, 2, 8, 8),  # 2,560 columns: 10 super-steps for 8 splits, two of them with one, none empty
    (2, 4, 1, 4, 29),
    (2, 8, 1, 8, 64),
])  # fmt: skip
@pytest.mark.parametrize("formats", [("Q4_K", "Q6_K"), ("Q8_0", "Q5_K")])
def test_gemv_mma2_cluster_splits_match_the_oracle_the_same_bits_every_run(
    cuda, rng, formats, m_tiles: int, n_tiles: int, col_warps: int, splits: int, n_tok: int
) -> None:  # fmt: skip
    """On sm_90+ a row tile's column splits are a thread-block cluster that adds them in rank order through
    distributed shared memory: every output written (they start as NaN, and nothing zeroes them), the
    oracle's values, and the same bits on every run, where float atomics would vary with more than two."""
    import cupy

    from app.engine.kernels.gemv_mma import gemv_mma
    from app.engine.kernels.runtime.compile import clusters_supported

    if not clusters_supported():
        pytest.skip("thread-block clusters need sm_90+")
    shape = MmaShape(m_tiles, n_tiles, col_warps, 4, splits, cluster=True)
    _check(cuda, rng, formats, (200, 77), 2560, n_tok, "v2", shape)
    tensors = [random_tensor(q, r, 2560, rng) for q, r in zip(formats, (300, 45), strict=True)]
    weights = [cuda.load_weight(t) for t in tensors]
    parts = [(w.data, q, w.row_bytes, w.n_rows) for w, q in zip(weights, formats, strict=True)]
    x = cupy.asarray(rng.standard_normal((n_tok, 2560)).astype(np.float32))
    runs = [cupy.asnumpy(gemv_mma(parts, 2560, x, cupy.full((n_tok, 345), cupy.nan, cupy.float32), shape=shape,
                                  kernel="v2")) for _ in range(4)]  # fmt: skip
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])
    whole = gemv_mma(parts, 2560, x, cupy.empty((n_tok, 345), cupy.float32), kernel="v2",
                     shape=MmaShape(m_tiles, n_tiles, col_warps, 4, 1))  # fmt: skip
    assert rel_err(runs[0], cupy.asnumpy(whole)) < 1e-5  # the same products, summed in another order


@pytest.mark.parametrize(("splits", "cluster"), [(1, False), (4, True), (2, False)])
def test_gemv_mma2_takes_float16_x_as_its_pre_pass_would_round_it(cuda, rng, splits: int, cluster: bool) -> None:
    """A float16 x (a norm or attention that wrote it so: linear.takes_half) goes to the product as it is: the same
    bits as the float32 x its pre-pass would round, unsplit, in a cluster and with atomic splits (whose pre-pass
    then only zeroes the output). gemv_mma.cu (v1) refuses it."""
    import cupy

    from app.engine.kernels.gemv_mma import gemv_mma
    from app.engine.kernels.runtime.compile import clusters_supported

    if cluster and not clusters_supported():
        pytest.skip("thread-block clusters need sm_90+")
    formats = ("Q4_K", "Q6_K")
    tensors = [random_tensor(q, r, 2048, rng) for q, r in zip(formats, (256, 64), strict=True)]
    weights = [cuda.load_weight(t) for t in tensors]
    parts = [(w.data, q, w.row_bytes, w.n_rows) for w, q in zip(weights, formats, strict=True)]
    x = cupy.asarray(rng.standard_normal((8, 2048)).astype(np.float32))
    shape = MmaShape(1, 1, 2, 4, splits, cluster=cluster)
    want = gemv_mma(parts, 2048, x, cupy.full((8, 320), cupy.nan, cupy.float32), shape=shape, kernel="v2")
    got = gemv_mma(parts, 2048, x.astype(cupy.float16), cupy.full((8, 320), cupy.nan, cupy.float32), shape=shape,
                   kernel="v2")  # fmt: skip
    if splits > 1 and not cluster:  # atomic splits add in any order
        assert rel_err(cupy.asnumpy(got), cupy.asnumpy(want)) < 1e-6
    else:
        np.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(want))
    with pytest.raises(ValueError, match="float16 x only on v2"):
        gemv_mma(parts, 2048, x.astype(cupy.float16), cupy.empty((8, 320), cupy.float32), kernel="v1")

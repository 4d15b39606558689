"""gemv_mma.py's launch shapes and argument checks: pure Python, no GPU (the kernels' numbers are
checked in test_emulated_gemv_mma.py and, on a GPU, test_cuda_gemv_mma.py)."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels import gemv_mma as gm
from app.engine.kernels.gemv_mma import MmaShape, cdiv, gemv_mma, pick_shape

# (rows, columns) of the products the v2 kernel is for: Qwen3-8B q, gate+up, down; the 27B and 31B
# shapes' q/gate+up/down; a small q/k/v; a 32-column vector-sized one.
PRODUCTS = [(4096, 4096), (24576, 4096), (4096, 12288), (5120, 5120), (34816, 5120), (5120, 17408),
            (43008, 5120), (5120, 21504), (232, 4096), (7, 32)]  # fmt: skip


@pytest.mark.parametrize("clusters", [False, True], ids=["atomics", "clusters"])
@pytest.mark.parametrize(("n_rows", "n_cols"), PRODUCTS)
@pytest.mark.parametrize("n_tok", [2, 4, 8, 9, 16, 17, 32, 33, 64])
def test_v2_shapes_fit_and_fill_the_gpu(n_tok: int, n_rows: int, n_cols: int, clusters: bool) -> None:
    """Without thread-block clusters at most MAX_SPLITS column splits (atomics); with them up to a cluster's
    MAX_CLUSTER, which only the cluster's shared memory for the sums pays for."""
    shape = pick_shape(n_tok, n_rows, n_cols, "v2", clusters)
    cap = gm.MAX_CLUSTER if clusters else gm.MAX_SPLITS
    assert 8 * shape.n_tiles >= n_tok and (shape.n_tiles == 1 or 4 * shape.n_tiles < n_tok)  # the fewest tiles
    assert shape.shared_bytes_v2() <= gm.MAX_SHARED_BYTES
    assert 32 * shape.row_warps * shape.warps <= 256  # the register budget of the 8-warp builds
    blocks = cdiv(n_rows, shape.rows())
    super_steps = cdiv(cdiv(n_cols // 32, 4), shape.warps)
    assert 1 <= shape.k_splits <= cap and shape.k_splits & (shape.k_splits - 1) == 0
    assert shape.clustered() == (clusters and shape.k_splits > 1)
    assert ("GM_CL" in gm.module_of("v2", ["Q4_K"], shape)[1]) == shape.clustered()
    waves = gm.WAVES * gm.MULTIPROCESSORS
    if shape.k_splits > 1:  # split only while the blocks stay within WAVES waves, >= 2 super-steps a split
        assert blocks * shape.k_splits <= waves
        assert super_steps >= 2 * shape.k_splits
    # no further split where one more would keep >= 2 super-steps: it would pass the waves, or the cap is hit
    if shape.k_splits < cap and super_steps >= 4 * shape.k_splits:
        assert blocks * 2 * shape.k_splits > waves


@pytest.mark.parametrize("max_splits", [1, 2, 4])
def test_v2_splits_keep_under_the_plans_cap(max_splits: int) -> None:
    """GemvPlan.mma_splits (PADDOCK_GEMV_MMA_SPLITS) caps the splits; one split is no cluster."""
    shape = pick_shape(32, 4096, 12288, "v2", clusters=True, max_splits=max_splits)
    assert shape.k_splits == max_splits and shape.clustered() == (max_splits > 1)
    assert pick_shape(32, 4096, 12288, "v2", clusters=True).k_splits == gm.MAX_CLUSTER


def test_v1_shape_has_no_v2_parts() -> None:
    shape = pick_shape(8, 4096, 4096)
    assert (shape.row_warps, shape.k_splits) == (1, 1)


def test_bad_kernel_and_shape_are_named() -> None:
    x = np.zeros((4, 64), np.float32)
    parts = [(None, "Q4_K", 144, 16)]
    with pytest.raises(ValueError, match="v3"):
        gemv_mma(parts, 64, x, None, kernel="v3")
    with pytest.raises(ValueError, match="v1 has no row-warps"):
        gemv_mma(parts, 64, x, None, shape=MmaShape(1, 1, 2, 4, 1), kernel="v1")


def test_v2_refuses_a_shape_over_the_shared_memory() -> None:
    x = np.zeros((64, 1024), np.float32)
    with pytest.raises(ValueError, match="shared memory"):
        gemv_mma([(None, "Q4_K", 576, 64)], 1024, x, None, shape=MmaShape(2, 8, 2, 4), kernel="v2")

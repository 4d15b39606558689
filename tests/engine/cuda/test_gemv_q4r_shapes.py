"""gemv_q4r's host-side choices (kernels/gemv_q4r.py, backend/cuda/linear.py): which weights repack into which
layout, the launch shape and its column splits, and which products the plan sends to the repacked copies.
No GPU needed."""

from __future__ import annotations

import pytest

from app.engine.backend.cuda import linear as cuda_linear
from app.engine.backend.cuda.weights import CudaFusedWeight, CudaWeight
from app.engine.kernels import gemv_q4r
from app.engine.kernels.gemv_plan import GemvPlan
from app.engine.quant.types import QUANT_TYPES


def test_formats_and_shapes_that_repack() -> None:
    assert gemv_q4r.packs("Q4_K", 4096, 4096) and gemv_q4r.packs("Q6_K", 1024, 12288)
    assert not gemv_q4r.packs("Q8_0", 4096, 4096)  # no decoder for it
    assert not gemv_q4r.packs("Q4_K", 4100, 4096)  # a partial 16-row tile
    assert not gemv_q4r.packs("Q4_K", 4096, 4000)  # a partial 256-weight block
    assert gemv_q4r.layout_of(["Q4_K", "Q4_K"]) == gemv_q4r.LAYOUT_4BIT
    assert gemv_q4r.layout_of(["Q4_K", "Q4_K", "Q6_K"]) == gemv_q4r.LAYOUT_BYTES  # Q4_K_M's q/k/v, v in Q6_K


@pytest.mark.parametrize(("n_tok", "n_tiles"), [(1, 1), (8, 1), (9, 2), (16, 2), (17, 4), (64, 8), (65, 16), (128, 16)])
def test_n_tiles_cover_the_tokens(n_tok: int, n_tiles: int) -> None:
    assert gemv_q4r.pick_shape(n_tok, 4096, 4096).n_tiles == n_tiles


@pytest.mark.parametrize(("rows", "cols"), [(4096, 4096), (6144, 4096), (24576, 4096), (4096, 12288), (151936, 4096),
                                            (128, 256)])  # fmt: skip
def test_splits_fill_the_grid_within_their_bounds(rows: int, cols: int) -> None:
    """Column splits only where row blocks are fewer than BLOCKS_TARGET, powers of two, each split keeping
    MIN_CHUNKS_PER_SPLIT 64-column chunks; the largest products take none."""
    shape = gemv_q4r.pick_shape(32, rows, cols)
    blocks, chunks = -(-rows // shape.rows()), cols // gemv_q4r.CHUNK
    assert shape.splits & (shape.splits - 1) == 0 and shape.splits <= gemv_q4r.MAX_SPLITS
    assert shape.splits == 1 or chunks // shape.splits >= gemv_q4r.MIN_CHUNKS_PER_SPLIT
    assert shape.splits == 1 or blocks * shape.splits // 2 < gemv_q4r.BLOCKS_TARGET  # no split more than needed
    if blocks >= gemv_q4r.BLOCKS_TARGET:
        assert shape.splits == 1
    if rows == 4096 and cols == 4096:
        assert shape.splits > 1  # a q or o projection: 32 row blocks for 132 multiprocessors


def _weight(qtype: str = "Q4_K", rows: int = 512, cols: int = 1024, repacked: bool = True) -> CudaWeight:
    q = QUANT_TYPES[qtype]
    weight = CudaWeight(f"w.{qtype}", q, (rows, cols), cols // q.block_size * q.type_size, data=object(),
                        dense16=object())  # fmt: skip
    weight.q4r = object() if repacked else None
    return weight


TOKENS = (1, 2, 3, 8, 17, 64, 128, 129, 300)


def _served(weight, plan: GemvPlan) -> list[int]:
    return [n for n in TOKENS if cuda_linear._q4r_serves(n, weight, plan)]


def test_the_plan_sends_its_token_range_to_the_repacked_copies() -> None:
    assert _served(_weight(), GemvPlan()) == []  # off by default: PADDOCK_Q4R_MAX_TOKENS=0
    assert _served(_weight(), GemvPlan(q4r_max_tokens=128)) == [2, 3, 8, 17, 64, 128]
    assert _served(_weight(), GemvPlan(q4r_max_tokens=1000, q4r_min_tokens=1)) == [1, 2, 3, 8, 17, 64, 128]  # its cap
    assert _served(_weight(), GemvPlan(q4r_max_tokens=16, q4r_min_tokens=3)) == [3, 8]
    assert _served(_weight(repacked=False), GemvPlan(q4r_max_tokens=128)) == []  # no copy made: the other paths
    fused = CudaFusedWeight((_weight(), _weight()), q4r=object())
    assert _served(fused, GemvPlan(q4r_max_tokens=32)) == [2, 3, 8, 17]

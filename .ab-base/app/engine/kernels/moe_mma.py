"""Wrapper of moe_mma.cu: the routed experts' grouped products of a prefill chunk on tensor cores.

kernels/moe.py's `moe_experts` sends a grouped product here instead of to moe_grouped_<fmt> when its
experts have many pairs each (`serves`): moe_grouped re-reads an expert's weights every MOE_T of its
pairs, this kernel once per tile of 32 or 64 pairs, and multiplies on tensor cores (moe_mma.cu says
how). Same inputs and output layout (`y[g, r]` in the grouped order), so the gated unit and the combine are
unchanged; three launches (the inputs to float16, each row scaled by a power of two into its range; the
tile list; the product), sized by the pair count alone, so no host sync and graph capture still works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.engine.kernels.gemv import format_defines
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr

if TYPE_CHECKING:
    from app.engine.kernels.moe import StackedExperts

# Every block format of quant.cuh (MOE_MMA_FORMATS in moe_mma.cu): the table formats too, so that GPT-OSS's
# MXFP4 experts prefill on tensor cores (on moe_grouped's CUDA cores an 8,000-token prompt took 8 s on an H100).
FORMATS = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                     "MXFP4", "NVFP4", "IQ4_NL", "IQ4_XS"})  # fmt: skip
THREADS = 256  # MMA_THREADS
TILE_THREADS = 256  # moe_mma_tiles' one block
HALF_THREADS = 256  # moe_mma_half: a warp an input row
MAX_GRID_Y = 65535  # the pair tiles are the grid's y


@dataclass(frozen=True)
class TileShape:
    pairs: int  # MMA_BM: one expert's pairs a tile
    rows: int  # MMA_BN: weight rows a tile


# 64 x 64 where experts average 64 pairs or more (Qwen3.5-35B-A3B from 2,048 tokens); below that 32 x 128,
# whose tiles leave half as much padding in each expert's last tile, for twice the weight decoding per pair.
SQUARE, FEW_PAIRS = TileShape(64, 64), TileShape(32, 128)
SQUARE_FROM_PAIRS = 64  # average pairs per expert
# Average pairs per expert from which the tensor cores take over: moe_grouped reads each expert's
# weights once per MOE_T = 4 of its pairs, so below 4 pairs an expert it reads them once, as this
# kernel does, without multiplying a 32-pair tile of mostly zeros. At Qwen3.5-35B-A3B's 256 experts,
# top 8, that is from 128 tokens; a decode step of up to 128 sequences stays on moe_grouped.
MIN_PAIRS_PER_EXPERT = 4


def pick_shape(pairs: int, n_experts: int) -> TileShape:
    return SQUARE if pairs >= SQUARE_FROM_PAIRS * n_experts else FEW_PAIRS


def serves(qtype_name: str, n_tok: int, k: int, n_experts: int, n_cols: int) -> bool:
    """Whether moe_experts' grouped product of `n_tok` tokens (k pairs each) of a model with `n_experts`
    experts, in `qtype_name`, goes to the tensor cores."""
    pairs = n_tok * k
    return (
        qtype_name in FORMATS
        and n_cols % 32 == 0
        and pairs >= MIN_PAIRS_PER_EXPERT * n_experts
        and max_tiles(pairs, n_experts, pick_shape(pairs, n_experts)) <= MAX_GRID_Y  # slots <= the model's experts
    )


def max_tiles(pairs: int, n_experts: int, shape: TileShape) -> int:
    """The most tiles `pairs` pairs over `n_experts` groups make: every group's last tile may be partial."""
    return cdiv(pairs, shape.pairs) + n_experts


def grouped_mma(
    w: StackedExperts, inputs: Any, per_pair: bool, order: Any, offsets: Any, k: int, n_experts: int, y: Any,
    shape: TileShape | None = None,
) -> Any:  # fmt: skip
    """`y[g, :] = W_e @ inputs[src(g)] (+ bias_e)` for the grouped pairs g of the first `n_experts` groups
    (`order`, `offsets` as moe_scatter and moe_offsets leave them; src(g) = order[g] // k, or g with
    `per_pair`); rows of later groups are left as they are. float32 in and out. `shape`: the tile shape
    (by default pick_shape's, by the pairs per group)."""
    if w.qtype_name not in FORMATS:
        raise ValueError(f"moe_mma has no decoder for {w.qtype_name} (it takes {sorted(FORMATS)})")
    pairs = order.shape[0]
    if inputs.shape[-1] != w.n_cols or y.shape != (pairs, w.n_rows):
        raise ValueError(f"moe_mma: inputs {inputs.shape} and output {y.shape} for {pairs} pairs of a "
                         f"[{w.n_rows}, {w.n_cols}] weight")  # fmt: skip
    shape = shape or pick_shape(pairs, n_experts)
    if shape not in (SQUARE, FEW_PAIRS):
        raise ValueError(f"moe_mma has no {shape.pairs} x {shape.rows} tiles (it takes {SQUARE} and {FEW_PAIRS})")
    bound = max_tiles(pairs, n_experts, shape)
    if bound > MAX_GRID_Y:
        raise ValueError(f"moe_mma takes up to {MAX_GRID_Y} pair tiles, {pairs} pairs need up to {bound}")
    import cupy as cp

    defines = {"MMA_BM": shape.pairs, "MMA_BN": shape.rows}
    inputs = cp.ascontiguousarray(inputs, cp.float32)  # as moe_grouped reads them: rows of n_cols
    n_inputs = inputs.size // w.n_cols
    half = cp.empty(inputs.shape, cp.float16)  # read by every row tile: converted once here
    inv_scale = cp.empty(n_inputs, cp.float32)
    launch(get_kernel("moe_mma.cu", "moe_mma_half", defines), (max(1, cdiv(n_inputs, HALF_THREADS // 32)),),
           (HALF_THREADS,), (inputs, i32(n_inputs), i32(w.n_cols), half, inv_scale))  # fmt: skip
    tiles = cp.empty(1 + 2 * bound, cp.int32)
    launch(get_kernel("moe_mma.cu", "moe_mma_tiles", defines), (1,), (TILE_THREADS,), (offsets, i32(n_experts), tiles))
    kernel = get_kernel("moe_mma.cu", f"moe_mma_{w.qtype_name.lower()}", {**format_defines(w.qtype_name), **defines})
    args = (w.data, i64(w.expert_stride), i64(w.row_bytes), i32(w.n_rows), i32(w.n_cols), half, inv_scale,
            i32(per_pair), order, offsets, tiles, i32(k), ptr(w.bias), y)  # fmt: skip
    launch(kernel, (cdiv(w.n_rows, shape.rows), bound), (THREADS,), args)
    return y

"""Wrapper of gemv_int.cu: single-token GEMVs over int16-quantized x (integer dot products).

gemv.py sends one token here when every weight is an integer format (the k-quants and the
32-weight formats), the weights hold at least MIN_BYTES and the quantized x fits the shared
memory a block can have without an opt-in; everything else keeps the float32-x kernels.
`PADDOCK_GEMV_INT_X=0` turns the path off (benchmarks compare the two).

Measured on the H200 (bench/NOTES-cuda.md, runs 26-28, `bench/gemv_sweep.py --int`): at the
Qwen3-8B shapes gate/up 26.7 -> 19.6 us (67% of copy bandwidth), down Q6_K 27.5 -> 20.4, down
Q4_K 15.3 -> 13.3, o 7.3 -> 6.3; below ~4 MB (every Qwen3-0.6B matrix) the float32-x kernels
stay 0.2-0.8 us faster, since quantizing x costs each block a round trip before its first
product. q/k/v in one launch (gemv_int_multi) measured level with the float kernel (11.05 vs
11.0 us: a Q4_K_M file's Q6_K v needs a second copy of x) until every warp loaded its first
weights before the PDL wait (xq_preload); since then it is 0.7% faster in the 8B decode graph
and gemv.py sends q/k/v here too (gemv.INT_MULTI).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import NULL, cdiv, f32, i32, i64, launch, ptr, resident_blocks

INT_X_FORMATS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
GROUP = 16  # columns per x scale (XQ_GROUP in gemv_int.cuh)
SHARED_LIMIT = 48 * 1024  # dynamic shared memory without the opt-in attribute
MIN_BYTES = 4 << 20  # smaller weights stay on the float32-x kernels (see above)
# The add + RMSNorm fused into the prologue (NormIn) paid off at hidden 1024 (Qwen3-0.6B: graph
# replay 1.04 -> 0.98 ms at batch 1, runs 32-33) and lost at 4096 (Qwen3-8B engine 307 tok/s
# without, 292 with, one machine, run 34), where every block reads 32 KB of x and residual
# before its first product.
FUSED_NORM_MAX_COLS = int(os.environ.get("PADDOCK_FUSED_NORM_MAX_COLS", "2048"))


# XQ_MIN_BLOCKS (gemv_int.cu), the blocks per multiprocessor ptxas must fit: 2 caps a thread at 128
# registers (8B step 2.53 -> 2.40 ms, 0.6B and batch 32 level: runs 76-77).
DEFAULT_MIN_BLOCKS = 2


@dataclass(frozen=True)
class LaunchShape:
    rows: int  # rows per warp (gate/up: of each)
    warps: int  # per block
    units: int  # 32-weight units a lane takes per step
    min_blocks: int = DEFAULT_MIN_BLOCKS  # XQ_MIN_BLOCKS of the build: its register cap


# Run-28 sweep at the 8B shapes: 8 warps beat 4 and 2 at every shape but q/k/v's: (2 rows, 4 warps,
# 2 units) 11.05 us against 13.4 with 8 warps. In the decode graph (gpu_run.sh ab, H200, runs 61-63
# and 2026-11-30) gate/up at 2 rows and q/k/v at 1 row of 8 warps took the 8B step (4096 columns)
# from 2.478 to 2.448 ms, twice, and the 0.6B one (1024) from 0.770 to 0.787 ms: hence by width.
WIDE_COLS = 4096
SHAPES: dict[str, tuple[LaunchShape, LaunchShape]] = {  # kernel -> (below WIDE_COLS, from there on)
    "SINGLE": (LaunchShape(2, 8, 2), LaunchShape(2, 8, 2)),
    "GATED": (LaunchShape(1, 8, 1), LaunchShape(2, 8, 1)),
    "MULTI": (LaunchShape(2, 4, 2), LaunchShape(1, 8, 2)),
}
# Wide builds by kernel and first weight's format, where the 8B decode graph measured better than
# SHAPES (tests/engine/test_kernels_compile.py checks that none spills):
# - register caps for more blocks per multiprocessor (run 78): gate/up at 3 blocks (79 registers
#   instead of 87) 2.400 -> 2.372 ms, q/k/v at 4 (64 instead of 112) 2.400 -> 2.388; o/down's
#   Q4_K build at 3 (77 instead of 87) lost, 2.444. With x quantized per group (run 85) q/k/v at 4
#   spills 8 bytes and at 3 (80 registers) took the step 2.322 -> 2.271 ms.
# - the single-weight k-quant products (o, down, the output projection) in blocks of 16 warps, one
#   per multiprocessor, with the same 128 registers as two blocks of 8: 2.322 -> 2.271 (run 85;
#   Llama-3-8B 2.210 -> 2.142, run 88). Q8_0 checkpoints lost 1.0-1.4% with them (run 88), and
#   Q5_K and Q8_0 spill at the caps above: other formats keep SHAPES.
WIDE_BY_FORMAT: dict[str, LaunchShape] = {
    "GATED_Q4_K": LaunchShape(2, 8, 1, min_blocks=3),
    "MULTI_Q4_K": LaunchShape(1, 8, 2, min_blocks=3),
    "SINGLE_Q4_K": LaunchShape(2, 16, 2, min_blocks=1),
    "SINGLE_Q6_K": LaunchShape(2, 16, 2, min_blocks=1),
}


def _env_overrides(prefix: str) -> dict[str, str]:
    """{"GATED": "3", "SINGLE_Q6_K": "2,8,1", ...} from $<prefix><KEY>, read once at import as the
    other switches are."""
    return {key.removeprefix(prefix): value for key, value in os.environ.items() if key.startswith(prefix)}


# A/B switches: `PADDOCK_GEMV_SHAPE_<KERNEL>[_<FORMAT>]="rows,warps,units"` and
# `PADDOCK_GEMV_MIN_BLOCKS[_<KERNEL>[_<FORMAT>]]=N` (the first weight's format) replace the
# defaults at every width, the more specific key winning.
SHAPE_OVERRIDES = _env_overrides("PADDOCK_GEMV_SHAPE_")
MIN_BLOCKS_OVERRIDES = _env_overrides("PADDOCK_GEMV_MIN_BLOCKS_")
MIN_BLOCKS_ALL = os.environ.get("PADDOCK_GEMV_MIN_BLOCKS")


def launch_shape(name: str, n_cols: int, first_format: str) -> LaunchShape:
    """The launch shape and register cap of kernel `name` (SINGLE, GATED, MULTI) over `n_cols`
    columns whose first weight has `first_format`, A/B overrides applied."""
    wide = n_cols >= WIDE_COLS
    key = f"{name}_{first_format}"
    shape = WIDE_BY_FORMAT[key] if wide and key in WIDE_BY_FORMAT else SHAPES[name][wide]
    if MIN_BLOCKS_ALL:
        shape = replace(shape, min_blocks=int(MIN_BLOCKS_ALL))
    for override in (name, key):
        if override in SHAPE_OVERRIDES:
            rows, warps, units = (int(v) for v in SHAPE_OVERRIDES[override].split(","))
            shape = replace(shape, rows=rows, warps=warps, units=units)
        if override in MIN_BLOCKS_OVERRIDES:
            shape = replace(shape, min_blocks=int(MIN_BLOCKS_OVERRIDES[override]))
    return shape


# Groups of 16 columns of x a thread loads at once when it quantizes x (XQ_QB): all of a wide x in
# one round trip (down's 12288 columns are 3 groups per thread of 256) costs registers the
# products need; `PADDOCK_GEMV_QB` for A/B runs.
MAX_QB = int(os.environ.get("PADDOCK_GEMV_QB", "2"))


def groups_per_thread(n_cols: int, threads: int, min_blocks: int) -> int:
    """XQ_QB of a build: one group at a time under the caps of 3+ blocks per multiprocessor (80
    registers and fewer), where a second group's 16 floats would spill."""
    if min_blocks > DEFAULT_MIN_BLOCKS:
        return 1
    return max(1, min(MAX_QB, cdiv(n_cols // GROUP, threads)))


BLOCKS_PER_SM = 4  # the grid's cap: more row groups than this loop inside a block (2-32: within 1%)
RESIDENT_CAP = os.environ.get("PADDOCK_GEMV_RESIDENT", "1") != "0"  # _launch; 0 for A/B runs


# The column map of each format, by its RUN1 (xq_layout in gemv_int.cuh): weights whose maps
# differ get their own copy of the quantized x.
_LAYOUT = {"Q4_K": 1, "Q5_K": 1, "Q6_K": 2}


def shared_bytes(n_cols: int, qtype_names: list[str] | tuple[str, ...] = ("Q8_0",)) -> int:
    """int16 codes plus one (scale, sum) float pair per 16 columns (xq_shared_bytes), per layout."""
    copies = len({_LAYOUT.get(q, 0) for q in qtype_names})
    return copies * (2 * n_cols + (n_cols // GROUP) * 8)


def enabled() -> bool:
    return os.environ.get("PADDOCK_GEMV_INT_X", "1") != "0"


def serves(
    n_tok: int, n_cols: int, qtype_names: list[str] | tuple[str, ...], nbytes: int = MIN_BYTES
) -> bool:
    """Whether this path takes a product of `nbytes` of weights (see the module docstring)."""
    return (
        n_tok == 1
        and nbytes >= MIN_BYTES
        and enabled()
        and n_cols % 32 == 0
        and shared_bytes(n_cols, qtype_names) <= SHARED_LIMIT
        and all(q in INT_X_FORMATS for q in qtype_names)
    )


@functools.cache
def _sm_count() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


@dataclass(frozen=True)
class NormIn:
    """The add + RMSNorm fused in front of a product (XqNorm in gemv_int.cuh): x is replaced by
    `(x + residual) * rstd * weight` and `x + residual` is written to `new_residual`."""

    residual: Any | None  # None: nothing to add (the first layer's norm)
    weight: Any
    new_residual: Any
    eps: float

    def args(self) -> tuple:
        return ptr(self.residual), self.weight, self.new_residual, f32(self.eps)


NO_NORM = (NULL, NULL, NULL, f32(0.0))


def _norm_args(norm: NormIn | None) -> tuple:
    return NO_NORM if norm is None else norm.args()


def _launch(kernel: Any, groups: int, smem: int, args: tuple, warps: int, blocks_per_sm: int) -> None:
    """Blocks loop over row groups, so the grid never needs more blocks than the GPU holds at
    once; a grid past that would run its last blocks as a second wave, one per multiprocessor,
    after the rest are done. A guard for variants with many registers: today's default shapes
    fit (run 53 measured the cap level at 8B)."""
    if RESIDENT_CAP:
        blocks_per_sm = min(blocks_per_sm, resident_blocks(kernel, 32 * warps, smem))
    blocks = min(cdiv(groups, warps), _sm_count() * blocks_per_sm)
    launch(kernel, (blocks,), (32 * warps,), args, shared_mem=smem)


def _build_shape(
    name: str, n_cols: int, first_format: str, rows: int | None, warps: int | None, units: int | None
) -> LaunchShape:
    """launch_shape with a caller's `rows` / `warps` / `units` (benchmarks) put in; an odd unit count
    per row takes one unit at a time."""
    shape = launch_shape(name, n_cols, first_format)
    shape = replace(shape, rows=rows or shape.rows, warps=warps or shape.warps, units=units or shape.units)
    return replace(shape, units=1) if (n_cols // 32) % shape.units else shape


def _defines(formats: list[str], shape: LaunchShape, n_cols: int, act: int = 0) -> dict[str, str | int]:
    """The -D set of one build for these weights' formats and this shape."""
    padded = [*formats, formats[-1], formats[-1]][:3]
    threads = 32 * shape.warps
    return {"XQ_F0": f"Fmt{padded[0]}", "XQ_F1": f"Fmt{padded[1]}", "XQ_F2": f"Fmt{padded[2]}", "XQ_R": shape.rows,
            "XQ_U": shape.units, "XQ_ACT": act, "XQ_MIN_BLOCKS": shape.min_blocks,
            "XQ_THREADS": threads, "XQ_QB": groups_per_thread(n_cols, threads, shape.min_blocks)}  # fmt: skip


def gemv_int(
    data: Any, qtype_name: str, row_bytes: int, n_rows: int, n_cols: int, x: Any, out: Any,
    bias: Any | None = None, rows: int | None = None, warps: int | None = None,
    blocks_per_sm: int = BLOCKS_PER_SM, units: int | None = None, norm: NormIn | None = None,
) -> Any:  # fmt: skip
    """`out[0, r] = W[r] . x[0] (+ bias[r])`, as gemv.gemv for one token; with `norm`, of the
    normalized x. `rows`, `warps`, `blocks_per_sm` and `units` override the launch shape (benchmarks)."""
    shape = _build_shape("SINGLE", n_cols, qtype_name, rows, warps, units)
    kernel = get_kernel("gemv_int.cu", "gemv_int", _defines([qtype_name], shape, n_cols))
    args = (data, i64(row_bytes), i32(n_rows), i32(n_cols), x, out, ptr(bias), *_norm_args(norm))
    smem = shared_bytes(n_cols, (qtype_name,))
    _launch(kernel, cdiv(n_rows, shape.rows), smem, args, shape.warps, blocks_per_sm)
    return out


def gemv_int_multi(
    parts: list[tuple[Any, str, int, int]], n_cols: int, x: Any, out: Any, bias: Any | None = None,
    rows: int | None = None, warps: int | None = None, blocks_per_sm: int = BLOCKS_PER_SM,
    units: int | None = None, norm: NormIn | None = None,
) -> Any:  # fmt: skip
    """2 or 3 weights `(data, qtype_name, row_bytes, n_rows)` stacked along the output, as
    gemv.gemv_multi for one token; with `norm`, of the normalized x."""
    padded = list(parts) + [(*parts[-1][:3], 0)] * (3 - len(parts))
    shape = _build_shape("MULTI", n_cols, parts[0][1], rows, warps, units)
    kernel = get_kernel("gemv_int.cu", "gemv_int_multi", _defines([p[1] for p in padded], shape, n_cols))
    args = (padded[0][0], padded[1][0], padded[2][0], i64(padded[0][2]), i64(padded[1][2]), i64(padded[2][2]),
            i32(padded[0][3]), i32(padded[1][3]), i32(padded[2][3]), i32(n_cols), x, out, ptr(bias),
            *_norm_args(norm))  # fmt: skip
    smem = shared_bytes(n_cols, [p[1] for p in parts])
    _launch(kernel, sum(cdiv(p[3], shape.rows) for p in padded), smem, args, shape.warps, blocks_per_sm)
    return out


def gemv_int_gated(
    gate: tuple[Any, str, int], up: tuple[Any, str, int], n_rows: int, n_cols: int, x: Any, act: int, out: Any,
    rows: int | None = None, warps: int | None = None, blocks_per_sm: int = BLOCKS_PER_SM,
    units: int | None = None, norm: NormIn | None = None,
) -> Any:  # fmt: skip
    """`out = act(x @ G.T) * (x @ U.T)` for one token, as gemv.gemv_gated (`act` its kernel code);
    with `norm`, of the normalized x."""
    shape = _build_shape("GATED", n_cols, gate[1], rows, warps, units)
    kernel = get_kernel("gemv_int.cu", "gemv_int_gated", _defines([gate[1], up[1]], shape, n_cols, act))
    args = (gate[0], up[0], i64(gate[2]), i64(up[2]), i32(n_rows), i32(n_cols), x, out, *_norm_args(norm))
    smem = shared_bytes(n_cols, (gate[1], up[1]))
    _launch(kernel, cdiv(n_rows, shape.rows), smem, args, shape.warps, blocks_per_sm)
    return out

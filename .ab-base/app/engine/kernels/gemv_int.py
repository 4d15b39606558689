"""Wrapper of gemv_int.cu: single-token GEMVs over int16-quantized x (integer dot products).

gemv.py sends one token here when every weight is an integer format (the k-quants and the
32-weight formats), the weights hold at least MIN_BYTES and the quantized x fits the shared
memory a block can opt into on every GPU the tables ship for (99 KB: x up to ~40k columns);
everything else keeps the float32-x kernels (below ~4 MB, quantizing x costs each block a round
trip that the product does not win back). Past 48 KB the launch opts in: the 31B-class down
products (21,504 columns, 54 KB) took the float32-x kernel before, whose Q6_K reads at about
half the int16-x kernel's bandwidth (27B down: 67.5 against 39.9 us, H100). The
backend's GemvPlan (gemv_plan.py) turns the path on or off and gives the launch shapes: by width,
and for some wide kernels by format, from the tuning tables (kernels/tuning/); their history is
in docs/tuning-log.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.engine.kernels.gemv_plan import DEFAULT_PLAN, GemvPlan
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import (
    LEAST_OPT_IN_SHARED_BYTES,
    NULL,
    allow_shared,
    cdiv,
    f32,
    i32,
    i64,
    launch,
    ptr,
    resident_blocks,
    sm_count,
)
from app.engine.kernels.tuning import LaunchShape

INT_X_FORMATS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
GROUP = 16  # columns per x scale (XQ_GROUP in gemv_int.cuh)
SHARED_LIMIT = LEAST_OPT_IN_SHARED_BYTES  # allow_shared raises a launch's past the default 48 KB
MIN_BYTES = 4 << 20  # smaller weights stay on the float32-x kernels (see above)
ONE_GROUP_MIN_BLOCKS = 3  # register caps of 3+ blocks per multiprocessor: x loaded one group at a time


def launch_shape(name: str, n_cols: int, first_format: str, plan: GemvPlan = DEFAULT_PLAN) -> LaunchShape:
    """The launch shape and register cap of kernel `name` (SINGLE, GATED, MULTI) over `n_cols`
    columns whose first weight has `first_format`, under `plan` (its tuning and overrides)."""
    return plan.int_shape(name, n_cols, first_format)


def groups_per_thread(n_cols: int, threads: int, min_blocks: int, max_groups: int) -> int:
    """XQ_QB of a build: all of a wide x in one round trip costs registers the products need, so
    at most `max_groups`, and one at a time under the caps of 3+ blocks per multiprocessor (80
    registers and fewer), where a second group's 16 floats would spill."""
    if min_blocks >= ONE_GROUP_MIN_BLOCKS:
        return 1
    return max(1, min(max_groups, cdiv(n_cols // GROUP, threads)))


BLOCKS_PER_SM = 4  # the grid's cap: more row groups than this loop inside a block (2-32: within 1%)


# The column map of each format, by its RUN1 (xq_layout in gemv_int.cuh): weights whose maps
# differ get their own copy of the quantized x.
_LAYOUT = {"Q4_K": 1, "Q5_K": 1, "Q6_K": 2}


def shared_bytes(n_cols: int, qtype_names: list[str] | tuple[str, ...] = ("Q8_0",)) -> int:
    """int16 codes plus one (scale, sum) float pair per 16 columns (xq_shared_bytes), per layout."""
    copies = len({_LAYOUT.get(q, 0) for q in qtype_names})
    return copies * (2 * n_cols + (n_cols // GROUP) * 8)


def serves(
    n_tok: int, n_cols: int, qtype_names: list[str] | tuple[str, ...], nbytes: int = MIN_BYTES
) -> bool:
    """Whether this path can take a product of `nbytes` of weights (see the module docstring)."""
    return (
        n_tok == 1
        and nbytes >= MIN_BYTES
        and n_cols % 32 == 0
        and shared_bytes(n_cols, qtype_names) <= SHARED_LIMIT
        and all(q in INT_X_FORMATS for q in qtype_names)
    )


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


def _launch(
    kernel: Any, groups: int, smem: int, args: tuple, warps: int, blocks_per_sm: int, resident_cap: bool
) -> None:
    """Blocks loop over row groups, so the grid never needs more blocks than the GPU holds at
    once; a grid past that would run its last blocks as a second wave, one per multiprocessor,
    after the rest are done. With `resident_cap`, a guard for variants with many registers (the
    default shapes fit, so it costs nothing there)."""
    allow_shared(kernel, smem)
    if resident_cap:
        blocks_per_sm = min(blocks_per_sm, resident_blocks(kernel, 32 * warps, smem))
    blocks = min(cdiv(groups, warps), sm_count() * blocks_per_sm)
    launch(kernel, (blocks,), (32 * warps,), args, shared_mem=smem)


def _build_shape(
    name: str, n_cols: int, first_format: str, rows: int | None, warps: int | None, units: int | None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> LaunchShape:  # fmt: skip
    """launch_shape with a caller's `rows` / `warps` / `units` (benchmarks) put in; an odd unit count
    per row takes one unit at a time."""
    shape = launch_shape(name, n_cols, first_format, plan)
    shape = replace(shape, rows=rows or shape.rows, warps=warps or shape.warps, units=units or shape.units)
    return replace(shape, units=1) if (n_cols // 32) % shape.units else shape


def _defines(
    formats: list[str], shape: LaunchShape, n_cols: int, act: int = 0, plan: GemvPlan = DEFAULT_PLAN
) -> dict[str, str | int]:
    """The -D set of one build for these weights' formats and this shape."""
    padded = [*formats, formats[-1], formats[-1]][:3]
    threads = 32 * shape.warps
    return {"XQ_F0": f"Fmt{padded[0]}", "XQ_F1": f"Fmt{padded[1]}", "XQ_F2": f"Fmt{padded[2]}", "XQ_R": shape.rows,
            "XQ_U": shape.units, "XQ_ACT": act, "XQ_MIN_BLOCKS": shape.min_blocks,
            "XQ_THREADS": threads, "XQ_QB": groups_per_thread(n_cols, threads, shape.min_blocks, plan.max_groups_per_thread)}  # fmt: skip


def gemv_int(
    data: Any, qtype_name: str, row_bytes: int, n_rows: int, n_cols: int, x: Any, out: Any,
    bias: Any | None = None, rows: int | None = None, warps: int | None = None,
    blocks_per_sm: int = BLOCKS_PER_SM, units: int | None = None, norm: NormIn | None = None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> Any:  # fmt: skip
    """`out[0, r] = W[r] . x[0] (+ bias[r])`, as gemv.gemv for one token; with `norm`, of the
    normalized x. `rows`, `warps`, `blocks_per_sm` and `units` override the launch shape (benchmarks)."""
    shape = _build_shape("SINGLE", n_cols, qtype_name, rows, warps, units, plan)
    kernel = get_kernel("gemv_int.cu", "gemv_int", _defines([qtype_name], shape, n_cols, plan=plan))
    args = (data, i64(row_bytes), i32(n_rows), i32(n_cols), x, out, ptr(bias), *_norm_args(norm))
    smem = shared_bytes(n_cols, (qtype_name,))
    _launch(kernel, cdiv(n_rows, shape.rows), smem, args, shape.warps, blocks_per_sm, plan.resident_cap)
    return out


def gemv_int_multi(
    parts: list[tuple[Any, str, int, int]], n_cols: int, x: Any, out: Any, bias: Any | None = None,
    rows: int | None = None, warps: int | None = None, blocks_per_sm: int = BLOCKS_PER_SM,
    units: int | None = None, norm: NormIn | None = None, plan: GemvPlan = DEFAULT_PLAN,
) -> Any:  # fmt: skip
    """2 or 3 weights `(data, qtype_name, row_bytes, n_rows)` stacked along the output, as
    gemv.gemv_multi for one token; with `norm`, of the normalized x."""
    padded = list(parts) + [(*parts[-1][:3], 0)] * (3 - len(parts))
    shape = _build_shape("MULTI", n_cols, parts[0][1], rows, warps, units, plan)
    defines = _defines([p[1] for p in padded], shape, n_cols, plan=plan)
    kernel = get_kernel("gemv_int.cu", "gemv_int_multi", defines)
    args = (padded[0][0], padded[1][0], padded[2][0], i64(padded[0][2]), i64(padded[1][2]), i64(padded[2][2]),
            i32(padded[0][3]), i32(padded[1][3]), i32(padded[2][3]), i32(n_cols), x, out, ptr(bias),
            *_norm_args(norm))  # fmt: skip
    smem = shared_bytes(n_cols, [p[1] for p in parts])
    groups = sum(cdiv(p[3], shape.rows) for p in padded)
    _launch(kernel, groups, smem, args, shape.warps, blocks_per_sm, plan.resident_cap)
    return out


def gemv_int_gated(
    gate: tuple[Any, str, int], up: tuple[Any, str, int], n_rows: int, n_cols: int, x: Any, act: int, out: Any,
    rows: int | None = None, warps: int | None = None, blocks_per_sm: int = BLOCKS_PER_SM,
    units: int | None = None, norm: NormIn | None = None, plan: GemvPlan = DEFAULT_PLAN,
) -> Any:  # fmt: skip
    """`out = act(x @ G.T) * (x @ U.T)` for one token, as gemv.gemv_gated (`act` its kernel code);
    with `norm`, of the normalized x."""
    shape = _build_shape("GATED", n_cols, gate[1], rows, warps, units, plan)
    kernel = get_kernel("gemv_int.cu", "gemv_int_gated", _defines([gate[1], up[1]], shape, n_cols, act, plan))
    args = (gate[0], up[0], i64(gate[2]), i64(up[2]), i32(n_rows), i32(n_cols), x, out, *_norm_args(norm))
    smem = shared_bytes(n_cols, (gate[1], up[1]))
    _launch(kernel, cdiv(n_rows, shape.rows), smem, args, shape.warps, blocks_per_sm, plan.resident_cap)
    return out

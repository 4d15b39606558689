"""Wrapper of gemv.cu: quantized matrix-vector products for up to 8 tokens.

One token over large integer-format weights (one weight, q/k/v, or gate/up) goes to gemv_int.py
(int16 x, integer dot products) where the plan has that path on, unless a launch shape is forced
(the benchmarks time these kernels' shapes); gemv_int.py says where and why. Rows per block come
from the plan's tuning table (kernels/tuning/)."""

from __future__ import annotations

from typing import Any

from app.engine.kernels import gemv_int
from app.engine.kernels.gemv_plan import DEFAULT_PLAN, GemvPlan
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr, sm_count

TOKEN_BUCKETS = (1, 2, 4, 8)  # kernel variants; n tokens run in the smallest bucket >= n
VARIANTS = {1: (8, 4, 1), 2: (4,), 4: (2,), 8: (2,)}  # rows per block compiled for each bucket (gemv.cu)
MAX_WARPS = 8  # GEMV_MAX_WARPS in gemv.cuh


def default_rows(bucket: int, qtype_name: str, plan: GemvPlan = DEFAULT_PLAN) -> int:
    """Rows per block for a token bucket and format (the plan's tuning; one of VARIANTS)."""
    return plan.float_rows(bucket, qtype_name)


MAX_TOKENS = TOKEN_BUCKETS[-1]


def format_defines(qtype_name: str) -> dict[str, str]:
    """The -D pair that selects one format's decoder (see PADDOCK_FORMATS in quant.cuh)."""
    return {"PADDOCK_FORMAT": qtype_name.lower(), "PADDOCK_FORMAT_STRUCT": f"Fmt{qtype_name}"}


def default_warps(n_cols: int) -> int:
    """Warps per block: about one 32-weight unit per lane, from 1 to 4 warps.

    8 warps lost to 4 at every Qwen3-8B shape on the H200 (docs/tuning-log.md)."""
    return max(1, min(4, cdiv(n_cols // 32, 32)))


def few_rows_shape(n_tok: int, n_rows: int, n_cols: int, sm_count: int) -> tuple[int, int] | None:
    """(rows per block, warps) for a one-token product of so few rows that the tuned row groups
    would leave most multiprocessors idle, else None: one row per block and a lane per 32-weight
    unit (up to MAX_WARPS warps), so every block's loads are in flight at once. Gated DeltaNet's F32
    beta/alpha ([2 x 48, 5120]) took 12.8 us at 8 rows a block (6 blocks, 0.08 TB/s of 1 MB)."""
    if n_tok != 1 or n_rows >= 2 * sm_count:
        return None
    return 1, max(1, min(MAX_WARPS, cdiv(n_cols // 32, 32)))


def gemv(
    data: Any,
    qtype_name: str,
    row_bytes: int,
    n_rows: int,
    n_cols: int,
    x: Any,
    out: Any,
    bias: Any | None = None,
    warps: int | None = None,
    rows_per_block: int | None = None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> Any:
    """`out[t, r] = sum_c W[r, c] x[t, c] (+ bias[r])` for float32 `x [T <= 8, n_cols]`.

    `data` is the padded uint8 device buffer of W's rows (`row_bytes` each); `n_cols`
    must be a multiple of 32. `out` is float32 `[T, n_rows]`.
    """
    n_tok = x.shape[0]
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"gemv takes 1..{MAX_TOKENS} tokens, got {n_tok}")
    if n_cols % 32:
        raise ValueError(f"gemv needs a multiple of 32 columns, got {n_cols}")
    if (
        warps is None
        and rows_per_block is None
        and plan.int_x
        and gemv_int.serves(n_tok, n_cols, (qtype_name,), row_bytes * n_rows)
        and not plan.single_takes_float_x(qtype_name, n_cols, n_rows)
    ):
        return gemv_int.gemv_int(data, qtype_name, row_bytes, n_rows, n_cols, x, out, bias, plan=plan)
    bucket = next(b for b in TOKEN_BUCKETS if b >= n_tok)
    rows = rows_per_block or default_rows(bucket, qtype_name, plan)
    few = None if rows_per_block or warps else few_rows_shape(n_tok, n_rows, n_cols, sm_count())
    if few is not None:
        rows, warps = few
    if rows not in VARIANTS[bucket]:
        raise ValueError(
            f"no gemv variant with {rows} rows per block for {bucket} tokens: {VARIANTS[bucket]}"
        )
    kernel = get_kernel("gemv.cu", f"gemv_{qtype_name.lower()}_t{bucket}_r{rows}", format_defines(qtype_name))
    warps = warps or default_warps(n_cols)
    grid = (cdiv(n_rows, rows),)
    launch(
        kernel,
        grid,
        (32 * warps,),
        (data, i64(row_bytes), i32(n_rows), i32(n_cols), x, i32(n_tok), out, ptr(bias)),
    )
    return out


# -- several weights in one launch (gemv_fused.cu) ------------------------------------------

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def fused_rows(bucket: int, plan: GemvPlan = DEFAULT_PLAN) -> int:
    """Rows per block of each weight in gemv_multi (and gate + up rows together in gemv_gated)."""
    return plan.fused_rows(bucket)


def _bucket(n_tok: int, n_cols: int) -> int:
    if not 1 <= n_tok <= MAX_TOKENS:
        raise ValueError(f"gemv takes 1..{MAX_TOKENS} tokens, got {n_tok}")
    if n_cols % 32:
        raise ValueError(f"gemv needs a multiple of 32 columns, got {n_cols}")
    return next(b for b in TOKEN_BUCKETS if b >= n_tok)


def _struct(qtype_name: str) -> str:
    return f"Fmt{qtype_name}"


def gemv_multi(
    parts: list[tuple[Any, str, int, int]],
    n_cols: int,
    x: Any,
    out: Any,
    bias: Any | None = None,
    rows_per_block: int | None = None,
    warps: int | None = None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> Any:
    """`out = x @ [W0; W1; W2].T (+ bias)` in one launch for 2 or 3 weights `(data, qtype_name,
    row_bytes, n_rows)` of `n_cols` columns; `out` is float32 `[T, sum n_rows]`. The last two
    arguments override the defaults (benchmarks)."""
    if not 2 <= len(parts) <= 3:
        raise ValueError(f"gemv_multi takes 2 or 3 weights, got {len(parts)}")
    n_tok = x.shape[0]
    bucket = _bucket(n_tok, n_cols)
    nbytes = sum(p[2] * p[3] for p in parts)
    names = [p[1] for p in parts]
    int_x = plan.int_x and plan.int_multi
    if rows_per_block is None and warps is None and int_x and gemv_int.serves(n_tok, n_cols, names, nbytes):
        return gemv_int.gemv_int_multi(parts, n_cols, x, out, bias, plan=plan)
    rows = rows_per_block or fused_rows(bucket, plan)
    padded = list(parts) + [(*parts[-1][:3], 0)] * (3 - len(parts))  # an empty third weight
    defines: dict[str, str | int] = {"MULTI_T": bucket}
    for i, (_, qtype_name, _, _) in enumerate(padded):
        defines[f"MULTI_F{i}"] = _struct(qtype_name)
        defines[f"MULTI_R{i}"] = rows
    kernel = get_kernel("gemv_fused.cu", "gemv_multi", defines)
    grid = (sum(cdiv(p[3], rows) for p in padded),)
    launch(
        kernel, grid, (32 * (warps or default_warps(n_cols)),),
        (padded[0][0], padded[1][0], padded[2][0], i64(padded[0][2]), i64(padded[1][2]), i64(padded[2][2]),
         i32(padded[0][3]), i32(padded[1][3]), i32(padded[2][3]), i32(n_cols), x, i32(n_tok), out, ptr(bias)),
    )  # fmt: skip
    return out


def gemv_gated(
    gate: tuple[Any, str, int],
    up: tuple[Any, str, int],
    n_rows: int,
    n_cols: int,
    x: Any,
    kind: str,
    out: Any,
    rows_half: int | None = None,
    warps: int | None = None,
    plan: GemvPlan = DEFAULT_PLAN,
) -> Any:
    """`out = act(x @ G.T) * (x @ U.T)` in one launch for weights `(data, qtype_name, row_bytes)`
    of `[n_rows, n_cols]`; `out` is float32 `[T, n_rows]`. `rows_half` (rows of each weight per
    block) and `warps` override the defaults (benchmarks)."""
    if kind not in ACTIVATIONS:
        raise ValueError(f"unknown activation {kind!r}; expected one of {sorted(ACTIVATIONS)}")
    n_tok = x.shape[0]
    bucket = _bucket(n_tok, n_cols)
    nbytes = (gate[2] + up[2]) * n_rows
    forced = warps is not None or rows_half is not None
    if not forced and plan.int_x and gemv_int.serves(n_tok, n_cols, (gate[1], up[1]), nbytes):
        return gemv_int.gemv_int_gated(gate, up, n_rows, n_cols, x, ACTIVATIONS[kind], out, plan=plan)
    half = rows_half or max(1, fused_rows(bucket, plan) // 2)
    defines = {"GATED_FA": _struct(gate[1]), "GATED_FB": _struct(up[1]), "GATED_RH": half,
               "GATED_T": bucket, "GATED_ACT": ACTIVATIONS[kind]}  # fmt: skip
    kernel = get_kernel("gemv_fused.cu", "gemv_gated", defines)
    launch(
        kernel, (cdiv(n_rows, half),), (32 * (warps or default_warps(n_cols)),),
        (gate[0], up[0], i64(gate[2]), i64(up[2]), i32(n_rows), i32(n_cols), x, i32(n_tok), out),
    )  # fmt: skip
    return out

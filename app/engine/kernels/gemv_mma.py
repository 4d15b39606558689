"""Wrapper of gemv_mma.cu: products of 2..MAX_TOKENS tokens on quantized weights, on tensor cores.

linear.py sends a decode step of several sequences here, instead of to the float32-x GEMVs
(compute-bound from 2 tokens) or to cuBLAS on float16 copies (3.4x the bytes of a Q4_K_M
file), when the plan's `mma_max_tokens` allows: gemv_mma.cu says why and how. Off by default
(PADDOCK_GEMV_MMA_MAX_TOKENS=0): on the H200 it is correct but still slower than both paths it
would replace (docs/tuning-log.md, 2026-12-02), latency-bound at ~0.9 TB/s. One launch serves up to three weights stacked along the
output. The launch shape (m-tiles a block, warps splitting the columns) is picked so that the
grid has about WARPS_TARGET warps: the product is bandwidth-bound, and a small matrix cut into
few blocks would leave most multiprocessors without loads in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr

FORMATS = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
N_TILES = (1, 2, 4, 8)  # builds by tokens: 8 per n-tile
MAX_TOKENS = 8 * N_TILES[-1]
WARPS_TARGET = 2048  # ~16 warps on each of the H200's 132 multiprocessors


@dataclass(frozen=True)
class MmaShape:
    m_tiles: int  # 16-row tiles a block
    n_tiles: int  # 8-token tiles
    warps: int  # warps a block, splitting the columns


def serves(
    n_tok: int, qtype_names: list[str] | tuple[str, ...], n_cols: int, max_tokens: int = MAX_TOKENS
) -> bool:
    return (
        2 <= n_tok <= min(max_tokens, MAX_TOKENS)
        and n_cols % 32 == 0
        and all(q in FORMATS for q in qtype_names)
    )


def pick_shape(n_tok: int, n_rows: int, n_cols: int) -> MmaShape:
    """Two m-tiles share each x load where the grid stays large; more n-tiles take one m-tile
    (registers); warps fill the grid up to WARPS_TARGET, no more than the 128-column steps."""
    n_tiles = next(n for n in N_TILES if 8 * n >= n_tok)
    m_tiles = 2 if n_tiles <= 2 and cdiv(n_rows, 32) >= 512 else 1
    tiles = cdiv(n_rows, 16 * m_tiles)
    steps = cdiv(n_cols // 32, 4)
    warps = next((w for w in (1, 2, 4, 8) if tiles * w >= WARPS_TARGET), 8)
    return MmaShape(m_tiles, n_tiles, max(1, min(warps, steps)))


def gemv_mma(
    parts: list[tuple[Any, str, int, int]], n_cols: int, x: Any, out: Any, bias: Any | None = None,
    shape: MmaShape | None = None,
) -> Any:  # fmt: skip
    """`out = x @ [W0; W1; W2].T (+ bias)` for float32 `x [T, n_cols]`, 2 <= T <= MAX_TOKENS, and
    1 to 3 weights `(data, qtype_name, row_bytes, n_rows)`; `out` is float32 `[T, sum n_rows]`.
    `shape` overrides the launch shape (benchmarks)."""
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"gemv_mma takes 1 to 3 weights, got {len(parts)}")
    n_tok = x.shape[0]
    if not 1 <= n_tok <= MAX_TOKENS or n_cols % 32:
        raise ValueError(f"gemv_mma takes 1..{MAX_TOKENS} tokens of a multiple of 32 columns, got {x.shape}")
    unknown = {p[1] for p in parts} - FORMATS
    if unknown:
        raise ValueError(f"gemv_mma has no decoder for {sorted(unknown)}")
    total_rows = sum(p[3] for p in parts)
    shape = shape or pick_shape(n_tok, total_rows, n_cols)
    padded = list(parts) + [(parts[-1][0], parts[-1][1], parts[-1][2], 0)] * (3 - len(parts))
    defines = {"GM_F0": f"Fmt{padded[0][1]}", "GM_F1": f"Fmt{padded[1][1]}", "GM_F2": f"Fmt{padded[2][1]}",
               "GM_MT": shape.m_tiles, "GM_NT": shape.n_tiles, "GM_WARPS": shape.warps}  # fmt: skip
    kernel = get_kernel("gemv_mma.cu", "gemv_mma", defines)
    rows = 16 * shape.m_tiles
    blocks = sum(cdiv(p[3], rows) for p in padded)
    args = (padded[0][0], padded[1][0], padded[2][0], i64(padded[0][2]), i64(padded[1][2]), i64(padded[2][2]),
            i32(padded[0][3]), i32(padded[1][3]), i32(padded[2][3]), i32(n_cols), x, i32(n_tok), out, ptr(bias))  # fmt: skip
    launch(kernel, (blocks,), (32 * shape.warps,), args)
    return out

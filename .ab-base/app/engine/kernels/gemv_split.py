"""Wrapper of gemv_split.cu: GEMV and dequantize for the split formats (FP8, NVFP4, MXFP4 safetensors).

A split weight is two device buffers, the codes (rows of `row_bytes`) and the scale grid in its
stored dtype, plus the `SplitLayout` that says how to read them. One module is compiled per
(codes, scale dtype) pair; rows per warp come from the token bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, f32, i32, i64, launch, ptr
from app.engine.quant.dispatch import QuantizedTensor

CODES = {
    "FP8_E4M3": ("e4m3", "CodesE4M3"),
    "NVFP4_SPLIT": ("e2m1", "CodesE2M1"),
    "MXFP4_SPLIT": ("e2m1", "CodesE2M1"),
}
SCALE_IDS = {"F32": 0, "BF16": 1, "F8_E4M3": 2, "E8M0": 3}  # scale_at<SD> in gemv_split.cu
# The (codes, scale dtype) pairs compiled: the layouts checkpoints use.
PAIRS = {("e4m3", 0), ("e4m3", 1), ("e2m1", 2), ("e2m1", 3)}
TOKEN_BUCKETS = (1, 2, 4, 8)
ROWS_PER_WARP = {1: 4, 2: 4, 4: 2, 8: 2}
WARPS = 4  # SPLIT_WARPS
UNIT = 16  # weights per unit (one scale); rows must be whole units
DEQUANT_THREADS = 256


@dataclass(frozen=True)
class SplitLayout:
    qtype_name: str
    row_bytes: int
    scale_dtype: str
    scale_cols: int
    group: tuple[int, int]
    global_scale: float

    @classmethod
    def of(cls, tensor: QuantizedTensor) -> SplitLayout:
        grid = tensor.scales
        if grid is None or tensor.qtype.name not in CODES:
            raise ValueError(f"tensor {tensor.name!r} ({tensor.qtype.name}) is not a split format")
        layout = cls(tensor.qtype.name, int(tensor.data.shape[1]), grid.dtype, int(grid.raw.shape[1]),
                     grid.group, float(grid.global_scale))  # fmt: skip
        if (CODES[layout.qtype_name][0], SCALE_IDS.get(grid.dtype, -1)) not in PAIRS:
            raise ValueError(
                f"tensor {tensor.name!r}: {tensor.qtype.name} with {grid.dtype} scales has no kernel"
            )
        if tensor.shape[-1] % UNIT or grid.group[1] % UNIT:
            raise ValueError(
                f"tensor {tensor.name!r}: rows and scale groups must be multiples of {UNIT} weights"
            )
        return layout

    def _module(self) -> tuple[str, dict[str, str | int]]:
        codes, struct = CODES[self.qtype_name]
        sd = SCALE_IDS[self.scale_dtype]
        return f"{codes}_s{sd}", {"SPLIT_CODES": codes, "SPLIT_CODES_STRUCT": struct, "SPLIT_SCALE": sd}

    def _scale_args(self) -> tuple[Any, ...]:
        return (i32(self.scale_cols), i32(self.group[0]), i32(self.group[1]), f32(self.global_scale))


def gemv_split(codes: Any, scales: Any, layout: SplitLayout, n_rows: int, n_cols: int, x: Any, out: Any,
               bias: Any | None = None) -> Any:  # fmt: skip
    """`out[t, r] = sum_c W[r, c] x[t, c] (+ bias[r])` for float32 `x [T <= 8, n_cols]`; `out` float32 `[T, n_rows]`."""
    n_tok = x.shape[0]
    if not 1 <= n_tok <= TOKEN_BUCKETS[-1]:
        raise ValueError(f"gemv_split takes 1..{TOKEN_BUCKETS[-1]} tokens, got {n_tok}")
    bucket = next(b for b in TOKEN_BUCKETS if b >= n_tok)
    rows = ROWS_PER_WARP[bucket]
    suffix, defines = layout._module()
    kernel = get_kernel("gemv_split.cu", f"gemv_split_{suffix}_t{bucket}_r{rows}", defines)
    launch(
        kernel, (cdiv(n_rows, WARPS * rows),), (32 * WARPS,),
        (codes, i64(layout.row_bytes), scales, *layout._scale_args(), i32(n_rows), i32(n_cols), x, i32(n_tok),
         out, ptr(bias)),
    )  # fmt: skip
    return out


def dequant_split_rows(codes: Any, scales: Any, layout: SplitLayout, n_src_rows: int, n_cols: int, out: Any,
                       ids: Any | None = None, row_offset: int = 0) -> Any:  # fmt: skip
    """Fill `out [n, n_cols]` (float32 or float16) with source rows `ids` (clamped into the tensor), or
    rows `row_offset .. row_offset + n` when `ids` is None."""
    import cupy

    out_name = {cupy.dtype(cupy.float32): "f32", cupy.dtype(cupy.float16): "f16"}[out.dtype]
    suffix, defines = layout._module()
    kernel = get_kernel("gemv_split.cu", f"dequant_split_{suffix}_{out_name}", defines)
    work = out.shape[0] * (n_cols // UNIT)
    if work:
        launch(
            kernel, (cdiv(work, DEQUANT_THREADS),), (DEQUANT_THREADS,),
            (codes, i64(layout.row_bytes), scales, *layout._scale_args(), i32(n_cols), ptr(ids), i32(out.shape[0]),
             i32(row_offset), i32(n_src_rows), out),
        )  # fmt: skip
    return out

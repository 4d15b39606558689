"""Wrapper of dequant.cu: rows of a GGUF tensor expanded to float32 or float16."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.gemv import format_defines
from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import cdiv, i32, i64, launch, ptr

THREADS = 256


def dequant_rows(
    data: Any,
    qtype_name: str,
    row_bytes: int,
    n_src_rows: int,
    n_cols: int,
    out: Any,
    ids: Any | None = None,
    row_offset: int = 0,
) -> Any:
    """Fill `out [n, n_cols]` (float32 or float16) with source rows `ids`, or rows
    `row_offset .. row_offset + n` when `ids` is None. Ids are clamped into the tensor."""
    import cupy

    if n_cols % 32:
        raise ValueError(f"dequantize needs a multiple of 32 columns, got {n_cols}")
    out_name = {cupy.dtype(cupy.float32): "f32", cupy.dtype(cupy.float16): "f16"}[out.dtype]
    n_out = out.shape[0]
    kernel = get_kernel("dequant.cu", f"dequant_{qtype_name.lower()}_{out_name}", format_defines(qtype_name))
    work = n_out * (n_cols // 32)
    if work:
        launch(
            kernel,
            (cdiv(work, THREADS),),
            (THREADS,),
            (data, i64(row_bytes), i32(n_cols), ptr(ids), i32(n_out), i32(row_offset), i32(n_src_rows), out),
        )
    return out

"""Rows of a GPU weight expanded to float32 or float16, whatever its format: the one entry for the
embedding gather, the float16 copies (dense.py) and the prefill products' scratch slices (linear.py)."""

from __future__ import annotations

from typing import Any

from app.engine.backend.cuda.weights import CudaWeight
from app.engine.kernels.dequant import dequant_rows
from app.engine.kernels.gemv_split import dequant_split_rows


def expand_rows(weight: CudaWeight, out: Any, ids: Any | None = None, row_offset: int = 0) -> Any:
    """Fill `out [n, n_cols]` with the weight's rows `ids` (clamped), or `row_offset ..` when `ids` is None."""
    if weight.layout is not None:
        return dequant_split_rows(weight.data, weight.scales, weight.layout, weight.n_rows, weight.n_cols, out, ids,
                                  row_offset)  # fmt: skip
    return dequant_rows(weight.data, weight.qtype.name, weight.row_bytes, weight.n_rows, weight.n_cols, out, ids,
                        row_offset)  # fmt: skip

"""Wrapper of norm.cu: RMSNorm, alone or fused with the residual add."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.compile import get_kernel
from app.engine.kernels.launch import f32, i32


def _threads(n_cols: int) -> int:
    # One block per row; up to 1024 threads, a whole number of warps, ~4 elements each.
    return min(1024, max(32, -(-n_cols // 4 // 32) * 32))


def rms_norm(x: Any, weight: Any, eps: float, out: Any) -> Any:
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    if n_rows:
        get_kernel("norm.cu", "rms_norm")(
            (n_rows,), (_threads(n_cols),), (x, weight, out, i32(n_cols), f32(eps))
        )
    return out


def add_rms_norm(
    x: Any, residual: Any, weight: Any, eps: float, out: Any, new_residual: Any
) -> tuple[Any, Any]:
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    if n_rows:
        get_kernel("norm.cu", "add_rms_norm")(
            (n_rows,), (_threads(n_cols),), (x, residual, weight, out, new_residual, i32(n_cols), f32(eps))
        )
    return out, new_residual

"""Wrapper of norm.cu: RMSNorm, alone or fused with the residual add; float32 out, or float16 for a product on
the weights' float16 copy (no cast kernel between them)."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.runtime.compile import get_kernel
from app.engine.kernels.runtime.launch import NULL, f32, i32, i64, launch

NORM_VEC = 4  # float4 loads per thread in the *_vec kernels (norm.cu)
MAX_VEC_COLS = 4 * NORM_VEC * 1024


def _threads(n_cols: int) -> int:
    # One block per row; up to 1024 threads, a whole number of warps, ~4 elements each.
    return min(1024, max(32, -(-n_cols // 4 // 32) * 32))


def vec_threads(n_cols: int) -> int:
    """Threads of a *_vec block: NORM_VEC float4s each, a whole number of warps."""
    return max(32, -(-n_cols // (4 * NORM_VEC) // 32) * 32)


def _vectorizable(n_cols: int, *arrays: Any) -> bool:
    """Rows of whole float4s, every pointer 16-byte aligned, and few enough columns for one block."""
    return n_cols % 4 == 0 and n_cols <= MAX_VEC_COLS and all(a.data.ptr % 16 == 0 for a in arrays)


def rms_norm(x: Any, weight: Any, eps: float, out: Any) -> Any:
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    if not n_rows:
        return out
    args = (x, weight, out, i32(n_cols), f32(eps))
    if _vectorizable(n_cols, x, weight, out):
        launch(get_kernel("norm.cu", "rms_norm_vec"), (n_rows,), (vec_threads(n_cols),), args)
    else:
        launch(get_kernel("norm.cu", "rms_norm"), (n_rows,), (_threads(n_cols),), args)
    return out


def add_rms_norm(
    x: Any, residual: Any, weight: Any, eps: float, out: Any, new_residual: Any
) -> tuple[Any, Any]:
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    if not n_rows:
        return out, new_residual
    args = (x, residual, weight, out, new_residual, i32(n_cols), f32(eps))
    if _vectorizable(n_cols, x, residual, weight, out, new_residual):
        launch(get_kernel("norm.cu", "add_rms_norm_vec"), (n_rows,), (vec_threads(n_cols),), args)
    else:
        launch(get_kernel("norm.cu", "add_rms_norm"), (n_rows,), (_threads(n_cols),), args)
    return out, new_residual


def rms_norm_join(x: Any, weight: Any, eps: float, join: Any, scale: Any | None, out: Any) -> Any | None:
    """`out = (rms_norm(x) + join) * scale[0]` (no scale: 1) in one launch, or None where the rows do
    not fit the float4 kernel (the caller then runs the three ops)."""
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    arrays = (x, weight, join, out) if scale is None else (x, weight, join, out, scale)
    if not _vectorizable(n_cols, *arrays) or (scale is not None and scale.size != 1):
        return None
    if n_rows:
        launch(get_kernel("norm.cu", "rms_norm_join_vec"), (n_rows,), (vec_threads(n_cols),),
               (x, weight, join, NULL if scale is None else scale, out, i32(n_cols), f32(eps)))  # fmt: skip
    return out


def rms_norm_pair(x: Any, weight: Any, weight2: Any, eps: float, out: Any, out2: Any) -> bool:
    """`out = rms_norm(x) * weight` and `out2 = rms_norm(x) * weight2` in one launch; False, with nothing
    done, where the rows do not fit the float4 kernel."""
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    if not _vectorizable(n_cols, x, weight, weight2, out, out2):
        return False
    if n_rows:
        launch(get_kernel("norm.cu", "rms_norm_pair_vec"), (n_rows,), (vec_threads(n_cols),),
               (x, weight, weight2, out, out2, i32(n_cols), f32(eps)))  # fmt: skip
    return True


def rms_norm_heads(x: Any, start: int, heads: int, weight: Any, eps: float) -> bool:
    """Normalise in place the `heads` rows of `weight.size` floats from column `start` of every row of `x`
    (2-D, contiguous); False, with nothing done, where the float4 kernel does not take them."""
    n_cols = weight.size
    n_tok, width = x.shape
    if (
        not x.flags.c_contiguous or width % 4 or start % 4 or start + heads * n_cols > width
        or not _vectorizable(n_cols, x, weight)
    ):  # fmt: skip
        return False
    if n_tok:
        launch(get_kernel("norm.cu", "rms_norm_heads_vec"), (n_tok * heads,), (vec_threads(n_cols),),
               (x, weight, i32(n_cols), f32(eps), i32(heads), i64(width), i64(start)))  # fmt: skip
    return True


def half_serves(n_cols: int, *arrays: Any) -> bool:
    """Whether rms_norm_half takes these rows (the float4 kernels only)."""
    return _vectorizable(n_cols, *arrays)


def rms_norm_half(
    x: Any, residual: Any | None, weight: Any, eps: float, out: Any, new_residual: Any | None
) -> Any:
    """`out` float16 = RMSNorm(x (+ residual)) * weight, as rms_norm / add_rms_norm then a cast to float16;
    with a residual, x + residual into `new_residual` (float32). Rows as half_serves takes them."""
    n_cols = x.shape[-1]
    n_rows = x.size // n_cols
    arrays = (x, weight, out) if residual is None else (x, residual, weight, out, new_residual)
    if not half_serves(n_cols, *arrays):
        raise ValueError(f"rms_norm_half takes aligned rows of a multiple of 4 up to {MAX_VEC_COLS}, got {n_cols}")
    if n_rows:
        if residual is None:
            name, args = "rms_norm_vec_h", (x, weight, out, i32(n_cols), f32(eps))
        else:
            name, args = "add_rms_norm_vec_h", (x, residual, weight, out, new_residual, i32(n_cols), f32(eps))
        launch(get_kernel("norm.cu", name), (n_rows,), (vec_threads(n_cols),), args)
    return out

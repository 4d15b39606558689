"""`linear` on the GPU: quantized GEMV for decode, dequantize-then-cuBLAS for prefill.

Up to `GEMV_MAX_TOKENS` rows of x, the GEMV kernels read the weight's blocks directly
(bandwidth-bound, one pass over the weight). Beyond that, slices of the weight's rows are
expanded to float16 into a scratch buffer and multiplied on the tensor cores by cuBLAS
(`cublasGemmEx`: float16 inputs, float32 accumulation and output), written straight into the output's
columns, so the scratch stays small even for a 150k-row vocabulary projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backend.cuda_weights import CudaWeight
from app.engine.kernels import gemv as gemv_kernels
from app.engine.kernels.dequant import dequant_rows

GEMV_MAX_TOKENS = gemv_kernels.MAX_TOKENS
SCRATCH_ELEMENTS = 32 << 20  # float16 weight elements per cuBLAS slice (64 MiB)

_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_16F = 0, 2
_CUBLAS_COMPUTE_32F = 68  # cublasComputeType_t: float32 accumulation (tensor cores for float16 inputs)
_CUBLAS_GEMM_DEFAULT = -1
_CUBLAS_POINTER_MODE_HOST = 0
# alpha and beta are passed by address (host pointer mode): CuPy's gemmEx takes pointers in every version.
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def linear(x: Any, weight: CudaWeight, bias: Any | None = None) -> Any:
    """`x @ W.T (+ bias)` for float32 `x [T, in]`: float32 `[T, out]`."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    if x.ndim != 2 or x.shape[1] != weight.n_cols:
        raise ValueError(f"linear {weight.name!r}: x of shape {x.shape} does not match weight {weight.shape}")
    if weight.dense is not None:
        out = x @ weight.dense.T
        return out + bias if bias is not None else out
    n_tok = x.shape[0]
    out = cupy.empty((n_tok, weight.n_rows), cupy.float32)
    if n_tok == 0:
        return out
    if n_tok <= GEMV_MAX_TOKENS:
        return gemv_kernels.gemv(
            weight.data, weight.qtype.name, weight.row_bytes, weight.n_rows, weight.n_cols, x, out, bias
        )
    matmul_dequant_cublas(x, weight, out)
    if bias is not None:
        out += bias
    return out


def matmul_dequant_cublas(x: Any, weight: CudaWeight, out: Any) -> Any:
    """`out = x @ W.T` through float16 slices of W and cuBLAS (`cublasGemmEx`, float32 out)."""
    import cupy

    n_tok, n_cols = x.shape
    n_rows = weight.n_rows
    x16 = x.astype(cupy.float16)
    # Slices of a multiple of 128 rows keep each slice's output column 512-byte aligned: an
    # unaligned output made cuBLAS 3x slower (4096 x 12288 at 2048 tokens, NOTES-cuda.md run 3).
    rows_per_slice = min(n_rows, max(128, SCRATCH_ELEMENTS // n_cols // 128 * 128))
    scratch = cupy.empty((min(rows_per_slice, n_rows), n_cols), cupy.float16)
    for r0 in range(0, n_rows, rows_per_slice):
        rows = min(rows_per_slice, n_rows - r0)
        w16 = scratch[:rows]
        dequant_rows(weight.data, weight.qtype.name, weight.row_bytes, n_rows, n_cols, w16, row_offset=r0)
        # Column-major view: out^T[r0:r0+rows, :] = W16 (rows x in) @ x16^T (in x T), ldc = n_rows.
        gemm_f16_f32(w16, x16, out.data.ptr + r0 * 4, rows, n_tok, n_cols, ldc=n_rows)
    return out


def gemm_f16_f32(w16: Any, x16: Any, out_ptr: int, m: int, n: int, k: int, ldc: int) -> None:
    """Column-major `C[m, n] = W16ᵀ[m, k] · X16[k, n]` for row-major float16 `w16 [m, k]`,
    `x16 [n, k]`, into float32 at `out_ptr` with leading dimension `ldc`."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    if mode != _CUBLAS_POINTER_MODE_HOST:
        cublas.setPointerMode(handle, _CUBLAS_POINTER_MODE_HOST)
    try:
        cublas.gemmEx(
            handle, _CUBLAS_OP_T, _CUBLAS_OP_N, m, n, k,
            _ONE.ctypes.data, w16.data.ptr, _CUDA_R_16F, k,
            x16.data.ptr, _CUDA_R_16F, k,
            _ZERO.ctypes.data, out_ptr, _CUDA_R_32F, ldc,
            _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip
    finally:
        if mode != _CUBLAS_POINTER_MODE_HOST:
            cublas.setPointerMode(handle, mode)

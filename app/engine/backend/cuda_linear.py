"""`linear` on the GPU: quantized GEMV for decode, dequantize-then-cuBLAS for prefill.

Up to `GEMV_MAX_TOKENS` rows of x, the GEMV kernels read the weight's blocks directly
(bandwidth-bound, one pass over the weight). Beyond that, slices of the weight's rows are
expanded to float16 into a scratch buffer and multiplied on the tensor cores by cuBLAS
(float16 inputs, float32 accumulation and output), written straight into the output's
columns, so the scratch stays small even for a 150k-row vocabulary projection.
"""

from __future__ import annotations

from typing import Any

from app.engine.backend.cuda_weights import CudaWeight
from app.engine.kernels import gemv as gemv_kernels
from app.engine.kernels.dequant import dequant_rows

GEMV_MAX_TOKENS = gemv_kernels.MAX_TOKENS
SCRATCH_ELEMENTS = 32 << 20  # float16 weight elements per cuBLAS slice (64 MiB)

_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_16F = 0, 2


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
    """`out = x @ W.T` through float16 slices of W and cuBLAS (`cublasSgemmEx`)."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    n_tok, n_cols = x.shape
    n_rows = weight.n_rows
    x16 = x.astype(cupy.float16)
    rows_per_slice = max(128, min(n_rows, SCRATCH_ELEMENTS // n_cols))
    scratch = cupy.empty((min(rows_per_slice, n_rows), n_cols), cupy.float16)
    handle = cupy.cuda.device.get_cublas_handle()
    for r0 in range(0, n_rows, rows_per_slice):
        rows = min(rows_per_slice, n_rows - r0)
        w16 = scratch[:rows]
        dequant_rows(weight.data, weight.qtype.name, weight.row_bytes, n_rows, n_cols, w16, row_offset=r0)
        # Column-major view: out^T[r0:r0+rows, :] = W16 (rows x in) @ x16^T (in x T), ldc = n_rows.
        cublas.sgemmEx(
            handle, _CUBLAS_OP_T, _CUBLAS_OP_N, rows, n_tok, n_cols,
            1.0, w16.data.ptr, _CUDA_R_16F, n_cols,
            x16.data.ptr, _CUDA_R_16F, n_cols,
            0.0, out.data.ptr + r0 * 4, _CUDA_R_32F, n_rows,
        )  # fmt: skip
    return out

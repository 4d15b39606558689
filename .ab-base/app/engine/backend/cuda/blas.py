"""cuBLAS matrix products through ctypes, so that they can be captured in a CUDA graph.

CuPy's own cuBLAS wrapper refuses to run while a stream is capturing ("calling cuBLAS
API during stream capture is currently unsupported", raised by its stream check), yet
cuBLAS itself supports capture. So the engine calls `cublasGemmEx` directly on the
library CuPy already loaded (dlopen by soname returns that copy), on a handle of its
own with a preallocated workspace: under capture cuBLAS must not allocate, and
`cublasSetStream` resets the workspace to the default pool, so it is set again after
every stream change. Pointer mode is host: alpha and beta are read at call (or
capture) time and baked into the launch.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from typing import Any

WORKSPACE_BYTES = 32 << 20  # cuBLAS asks for 32 MiB on Hopper; smaller GPUs need less
_SONAMES = ("libcublas.so.13", "libcublas.so.12", "cublas64_13.dll", "cublas64_12.dll")

OP_N, OP_T = 0, 1
R_32F, R_16F = 0, 2  # cudaDataType_t
COMPUTE_32F = 68  # cublasComputeType_t: float32 accumulation (tensor cores for float16 inputs)
COMPUTE_32F_FAST_TF32 = 77  # float32 inputs on the tensor cores (TF32)
GEMM_DEFAULT = -1
POINTER_MODE_HOST = 0


class CublasError(RuntimeError):
    """A cuBLAS call returned a non-zero status."""


def _load_library() -> ctypes.CDLL:
    # CuPy's cuBLAS module links the library; importing it first makes the soname resolve to
    # the copy already in the process (and to the right CUDA major version).
    with contextlib.suppress(ImportError):
        import cupy_backends.cuda.libs.cublas  # noqa: F401
    errors = []
    for name in _SONAMES:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise CublasError("cuBLAS library not found: " + "; ".join(errors))


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = _load_library()
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(p)]
    lib.cublasSetStream_v2.argtypes = [p, p]
    lib.cublasSetWorkspace_v2.argtypes = [p, p, ctypes.c_size_t]
    lib.cublasSetPointerMode_v2.argtypes = [p, i]
    lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
    for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
               lib.cublasSetPointerMode_v2, lib.cublasGemmEx):  # fmt: skip
        fn.restype = ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} failed with cuBLAS status {status}")


class Cublas:
    """One cuBLAS handle of the current device, with its own workspace."""

    def __init__(self, workspace_bytes: int = WORKSPACE_BYTES) -> None:
        import cupy

        self._lib = _lib()
        self._handle = ctypes.c_void_p()
        _check(self._lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._workspace = cupy.empty(workspace_bytes, dtype=cupy.uint8)
        _check(self._lib.cublasSetPointerMode_v2(self._handle, POINTER_MODE_HOST), "cublasSetPointerMode")
        self._stream: int | None = None
        self._one = ctypes.c_float(1.0)
        self._zero = ctypes.c_float(0.0)
        self._lock = threading.Lock()

    def _use_stream(self, stream: int) -> None:
        if stream == self._stream:
            return
        _check(self._lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream)), "cublasSetStream")
        # SetStream puts the default workspace pool back: ours again, or capture would allocate.
        _check(
            self._lib.cublasSetWorkspace_v2(
                self._handle, ctypes.c_void_p(self._workspace.data.ptr), self._workspace.nbytes
            ),
            "cublasSetWorkspace",
        )
        self._stream = stream

    def gemm(
        self,
        trans_a: int,
        trans_b: int,
        m: int,
        n: int,
        k: int,
        a_ptr: int,
        a_type: int,
        lda: int,
        b_ptr: int,
        b_type: int,
        ldb: int,
        c_ptr: int,
        c_type: int,
        ldc: int,
        compute: int = COMPUTE_32F,
    ) -> None:
        """Column-major `C[m, n] = op(A) · op(B)` on CuPy's current stream (alpha 1, beta 0)."""
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
        with self._lock:  # the handle's stream is shared state
            self._use_stream(stream)
            status = self._lib.cublasGemmEx(
                self._handle, trans_a, trans_b, m, n, k,
                ctypes.byref(self._one), ctypes.c_void_p(a_ptr), a_type, lda,
                ctypes.c_void_p(b_ptr), b_type, ldb,
                ctypes.byref(self._zero), ctypes.c_void_p(c_ptr), c_type, ldc,
                compute, GEMM_DEFAULT,
            )  # fmt: skip
        _check(status, f"cublasGemmEx(m={m}, n={n}, k={k})")


_handles: dict[int, Cublas] = {}


def cublas() -> Cublas:
    """The process's handle for the current device (made on first use)."""
    import cupy

    device = cupy.cuda.Device().id
    handle = _handles.get(device)
    if handle is None:
        handle = _handles[device] = Cublas()
    return handle


def matmul_t(x: Any, w: Any, out: Any, out_ptr: int | None = None, ldc: int | None = None) -> Any:
    """`out = x @ w.T` for row-major `x [n, k]` and `w [m, k]` of one float dtype
    (float16: float32 accumulation on the tensor cores; float32: TF32 is not used, plain
    float32). `out` is float32 `[n, m]`; `out_ptr`/`ldc` write into a column slice of a
    wider output instead (row stride `ldc` elements)."""
    import cupy

    n, k = x.shape
    m = w.shape[0]
    if x.dtype != w.dtype or w.shape[1] != k:
        raise ValueError(f"matmul_t: x {x.shape} {x.dtype} and w {w.shape} {w.dtype} do not match")
    dtype = R_16F if x.dtype == cupy.float16 else R_32F
    # Column-major view: out^T [m, n] = W [m, k] (rows of k, so op T) · x^T [k, n].
    cublas().gemm(
        OP_T, OP_N, m, n, k, w.data.ptr, dtype, k, x.data.ptr, dtype, k,
        out.data.ptr if out_ptr is None else out_ptr, R_32F, m if ldc is None else ldc,
    )  # fmt: skip
    return out

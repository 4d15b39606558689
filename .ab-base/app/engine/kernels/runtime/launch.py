"""Small helpers shared by the kernel wrappers: argument packing and grid sizes.

CuPy packs a launch argument by its type, so every scalar is passed as a sized numpy
scalar (a bare Python int would not say whether the kernel wants 32 or 64 bits) and an
absent pointer as a 64-bit zero.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.kernels.runtime import pdl

NULL = np.uint64(0)


def i32(v: int) -> np.int32:
    return np.int32(v)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


def ptr(array: Any | None) -> Any:
    """The array itself (CuPy passes its device pointer) or a null pointer."""
    return NULL if array is None else array


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resident_blocks(kernel: Any, threads: int, shared_mem: int) -> int:
    """How many blocks of `kernel` one multiprocessor holds at once, by its registers, shared
    memory and threads (the driver's occupancy calculator)."""
    return _resident_blocks(pdl.function_ptr(kernel), threads, shared_mem)


@functools.cache
def _resident_blocks(function_ptr: int, threads: int, shared_mem: int) -> int:
    from cupy_backends.cuda.api import driver

    return max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(function_ptr, threads, shared_mem)))


# Dynamic shared memory a block may take without opting in; past it the function needs
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8) raised, up to the device's opt-in limit
# (cudaDevAttrMaxSharedMemoryPerBlockOptin, 97): 227 KB on sm_90, 163 KB on sm_80, 99 KB on sm_86/89/120.
DEFAULT_SHARED_BYTES = 48 * 1024
LEAST_OPT_IN_SHARED_BYTES = 99 * 1024  # of the GPUs the tuning tables ship for (sm_86 up)
_MAX_DYNAMIC_SHARED = 8
_STATIC_SHARED = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
_MAX_SHARED_OPTIN = 97


@functools.cache
def sm_count() -> int:
    """The multiprocessors of this device."""
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


@functools.cache
def max_shared_bytes() -> int:
    """The opt-in shared memory per block of this device."""
    import cupy

    return int(cupy.cuda.runtime.deviceGetAttribute(_MAX_SHARED_OPTIN, cupy.cuda.Device().id))


def allow_shared(kernel: Any, nbytes: int) -> None:
    """Let `kernel` take `nbytes` of dynamic shared memory. A block's dynamic and static shared memory
    together past the default 48 KB need the opt-in attribute: 48 KB of dynamic memory exactly beside a
    kernel's few static bytes fails its launch (CUDA_ERROR_INVALID_VALUE) without it."""
    if nbytes > 0:
        _allow_shared(pdl.function_ptr(kernel), nbytes)


@functools.cache
def _allow_shared(function_ptr: int, nbytes: int) -> None:
    """cuFuncSetAttribute where needed, once per (function, size): the attribute stays set on the function."""
    import ctypes

    library = pdl.driver_library()
    static = ctypes.c_int(0)
    status = library.cuFuncGetAttribute(ctypes.byref(static), ctypes.c_int(_STATIC_SHARED), ctypes.c_void_p(function_ptr))
    if status != 0:
        raise RuntimeError(f"cuFuncGetAttribute(static shared memory) failed with CUDA error {status}")
    if nbytes + static.value <= DEFAULT_SHARED_BYTES:
        return
    status = library.cuFuncSetAttribute(
        ctypes.c_void_p(function_ptr), ctypes.c_int(_MAX_DYNAMIC_SHARED), ctypes.c_int(nbytes)
    )
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared memory = {nbytes}) failed with CUDA error {status}")


def require(array: Any, dtype: Any, name: str) -> Any:
    """`array` as a C-contiguous device array of `dtype` (a copy only when needed)."""
    import cupy

    out = cupy.ascontiguousarray(cupy.asarray(array), dtype=dtype)
    if out.ndim == 0:
        raise ValueError(f"{name}: expected an array, got a scalar")
    return out


def launch(
    kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
) -> None:
    """Launch on the current stream; within `pdl.programmatic_launches()` (graph capture) the
    kernel may overlap the one before it (pdl.py)."""
    if pdl.active():
        pdl.launch_programmatic(kernel, grid, block, args, shared_mem)
    else:
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)

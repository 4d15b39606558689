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

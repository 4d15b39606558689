"""Programmatic dependent launch (sm_90+): a kernel starts while the one before it drains.

In a CUDA graph each kernel normally starts only after the previous one has fully
finished and its memory is flushed, and its blocks then ramp up from nothing: a gap of a
few microseconds per kernel, which at batch 1 is most of a small model's decode step
(~200 kernels of a few microseconds each). Launched with the driver's
"programmatic stream serialization" attribute, a kernel may begin as soon as every block
of its predecessor has executed `griddepcontrol.launch_dependents`; it then prefetches
what does not depend on the predecessor (its weights) and blocks in
`griddepcontrol.wait` until the predecessor has completed and its writes are visible.

The contract every kernel of this folder keeps (`wait_previous_grid()` /
`launch_next_grid()` in common.cuh): before the wait it touches no memory that another
kernel writes or reads (only weights, and only as L2 prefetches); it triggers its
dependents right after its own wait, so at most two kernels overlap. Without the
attribute, or below sm_90, the two instructions are no-ops and launches serialize as
usual.

CuPy's launcher has no launch attributes, so `cuLaunchKernelEx` is called through ctypes
on the kernel's CUfunction. Only launches inside `programmatic_launches()` (the decode
graphs' capture) take this path: it is slower in Python than CuPy's launcher, which
the eager steps keep. The backend's KernelOptions.pdl turns it off (`programmatic_launches(False)`).

Thread-block clusters need no attribute here: a kernel declared with `__cluster_dims__`
(attention_decode.cu on sm_90+) carries its cluster shape in the function (PTX
`.reqnctapercluster`), and every launch of it, plain `cuLaunchKernel` (CuPy) or
`cuLaunchKernelEx` without a cluster attribute, runs in clusters of that shape; the CUDA
programming guide launches such kernels with plain `<<<>>>` and says their cluster size cannot
be changed at launch. The grid must be a multiple of it (the wrapper's business).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
MIN_COMPUTE_CAPABILITY = 90

_state = threading.local()


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: a 4-byte id padded to 8, then a 64-byte union whose first int is
    # programmaticStreamSerializationAllowed.
    _fields_ = [
        ("id", ctypes.c_uint),
        ("pad", ctypes.c_char * 4),
        ("value", ctypes.c_uint),
        ("rest", ctypes.c_char * 60),
    ]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


class LaunchError(RuntimeError):
    """cuLaunchKernelEx returned an error."""


@functools.cache
def driver_library() -> ctypes.CDLL:
    """The CUDA driver library (libcuda), for the calls CuPy does not wrap."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(name)
            lib.cuLaunchKernelEx.argtypes = [
                ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
            ]  # fmt: skip
            lib.cuLaunchKernelEx.restype = ctypes.c_int
            return lib
    raise LaunchError("the CUDA driver library (libcuda) was not found")


@functools.cache
def supported() -> bool:
    """Whether this device can launch programmatically: sm_90+."""
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= MIN_COMPUTE_CAPABILITY


@contextlib.contextmanager
def programmatic_launches(enabled: bool = True) -> Iterator[None]:
    """Kernels of this folder launched within (on this thread) overlap their predecessor, where
    `enabled` and the device supports it."""
    previous = getattr(_state, "on", False)
    _state.on = enabled and supported()
    try:
        yield
    finally:
        _state.on = previous


def active() -> bool:
    return getattr(_state, "on", False)


def _argument(value: Any) -> ctypes._SimpleCData:
    """A kernel argument as the C value the kernel's parameter expects (see launch.py: scalars
    are sized numpy scalars, arrays pass their device pointer)."""
    if isinstance(value, np.generic):
        kind = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.uint32): ctypes.c_uint32,
                np.dtype(np.float32): ctypes.c_float}.get(value.dtype)  # fmt: skip
        if kind is None:
            raise TypeError(f"kernel argument of dtype {value.dtype} is not supported")
        return kind(value.item())
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):  # a CuPy array
        return ctypes.c_void_p(data.ptr)
    raise TypeError(f"kernel argument {type(value).__name__} is not supported")


def function_ptr(kernel: Any) -> int:
    """The CUfunction of a CuPy RawKernel (its loaded `.kernel`) or of a module's Function."""
    return int(getattr(kernel, "kernel", kernel).ptr)


def launch_programmatic(
    kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
) -> None:
    """`kernel<<<grid, block, shared_mem, current stream>>>(args)` allowed to overlap its predecessor."""
    import cupy

    grid3 = (*grid, 1, 1)[:3]
    block3 = (*block, 1, 1)[:3]
    values = [_argument(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = _LaunchConfig(
        (ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(*block3), shared_mem,
        ctypes.c_void_p(cupy.cuda.get_current_stream().ptr), ctypes.pointer(attribute), 1,
    )  # fmt: skip
    status = driver_library().cuLaunchKernelEx(
        ctypes.byref(config), ctypes.c_void_p(function_ptr(kernel)), params, None
    )
    if status != 0:
        raise LaunchError(f"cuLaunchKernelEx failed with CUDA error {status}")

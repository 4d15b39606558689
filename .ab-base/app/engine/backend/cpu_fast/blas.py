"""numpy's OpenBLAS held to one thread while the fast backend runs its own threads through it.

Prefill's products are BLAS calls on decoded tiles (backend.py). Left to itself, OpenBLAS starts
a thread per core for each call, and those threads spin against numba's and against each other's
tile: on this 2-core VM a 512 x 640 x 3276 float32 product ran at 22 GMAC/s on two BLAS threads
and 58 GMAC/s on one (same run, shared machine). The backend instead splits the tiles over its own
`--threads` workers, each calling a one-thread BLAS. OpenBLAS's count is process-wide, so it is
set for the duration of a product and restored after: another thread's BLAS call meanwhile runs on
one thread, slower but the same numbers.

Found through numpy's bundled library (numpy.libs, the wheels' layout on Linux and Windows); where
numpy uses another BLAS (macOS Accelerate, a distribution's build) nothing is changed.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


@functools.cache
def _controls() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr] | None:
    """(get_num_threads, set_num_threads) of the OpenBLAS numpy loaded, or None."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(libs.glob("*openblas*")) if libs.is_dir() else ():
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, put
    return None


def controllable() -> bool:
    return _controls() is not None


@contextmanager
def one_thread() -> Iterator[None]:
    """OpenBLAS on one thread inside the block (a no-op where it cannot be controlled)."""
    controls = _controls()
    if controls is None:
        yield
        return
    get, put = controls
    before = get()
    put(1)
    try:
        yield
    finally:
        put(before)

"""Backend selection: CUDA when asked for (or available under "auto"), numpy otherwise."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def select_backend(
    device: str, weight_cache: str = "auto", cpu_kernels: str = "auto", threads: int | None = None
) -> Any:
    """Build the backend for `device` ("auto", "cpu" or "cuda"); `weight_cache` is the CUDA
    backend's float16 weight-copy mode ("auto", "on", "off"); `cpu_kernels` and `threads` choose
    the CPU backend's products ("auto", "numba", "numpy") and their thread count."""
    if device == "cpu":
        return cpu_backend(cpu_kernels, threads)
    try:
        from app.engine.backend.cuda.backend import CudaBackend, cuda_available
    except ImportError as exc:  # the CUDA backend's own modules are missing: treat as unavailable
        ok, reason = False, f"CUDA backend not importable ({exc})"
    else:
        ok, reason = cuda_available()
    if ok:
        return CudaBackend(dense_cache=weight_cache)
    if device == "cuda":
        raise RuntimeError(f"--device cuda was requested but no usable GPU was found: {reason}")
    log.info("No usable GPU (%s); running on the CPU.", reason)
    return cpu_backend(cpu_kernels, threads)


def cpu_backend(kernels: str = "auto", threads: int | None = None) -> Any:
    """The numba fast path (`kernels` "numba", or "auto" where numba imports) or the numpy reference."""
    from app.engine.backend.cpu import CpuBackend
    from app.engine.backend.cpu_fast import available

    if kernels == "numpy":
        return CpuBackend()
    ok, reason = available()
    if ok:
        from app.engine.backend.cpu_fast.backend import FastCpuBackend

        return FastCpuBackend(threads)
    if kernels == "numba":
        raise RuntimeError(f"--cpu-kernels numba was requested but {reason}")
    log.info("CPU kernels: numpy (%s)", reason)
    return CpuBackend()

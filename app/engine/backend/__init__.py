"""Backend selection: CUDA when asked for (or available under "auto"), numpy otherwise."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def select_backend(device: str, weight_cache: str = "auto") -> Any:
    """Build the backend for `device` ("auto", "cpu" or "cuda"); `weight_cache` is the CUDA
    backend's float16 weight-copy mode ("auto", "on", "off")."""
    if device == "cpu":
        from app.engine.backend.cpu import CpuBackend

        return CpuBackend()
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
    log.info("No usable GPU (%s); running on the CPU with the numpy backend.", reason)
    from app.engine.backend.cpu import CpuBackend

    return CpuBackend()

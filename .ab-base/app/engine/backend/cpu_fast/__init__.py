"""The CPU backend's fast path: numba kernels over the GGUF blocks (see backend.py, kernels.py).

`available()` says whether numba imports here; `select_backend` falls back to the numpy backend,
with a logged reason, where it does not.

OpenMP's threads (numba's threading layer here) spin after each parallel region by default, and
spin against OpenBLAS's threads in the prefill products that follow; passive waiting measured 10-30x
faster prefill products on 2 cores. libgomp reads the setting when numba first loads it, so it is set
here, before any kernel runs, unless the user set it.
"""

from __future__ import annotations

from app.engine.envs import set_library_default

set_library_default("OMP_WAIT_POLICY", "PASSIVE")


def available() -> tuple[bool, str]:
    try:
        import numba  # noqa: F401
    except ImportError as exc:
        return False, f"numba is not importable ({exc})"
    return True, ""

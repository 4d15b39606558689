"""Backend-level behaviour: availability report, clear errors, memory round trips."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_cuda_available_describes_the_gpu(cuda) -> None:
    from app.engine.backend.cuda.backend import cuda_available

    ok, text = cuda_available()
    assert ok and "sm_" in text


def test_not_enough_free_memory_is_a_clear_error(cuda) -> None:
    from app.engine.backend.cuda.backend import CudaBackend, CudaUnavailableError

    with pytest.raises(CudaUnavailableError, match="MiB free"):
        CudaBackend(min_free_bytes=1 << 50)


def test_host_round_trip_and_kv_dtype(cuda) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(cuda.to_host(cuda.from_host(x)), x)
    assert cuda.from_host([1, 2], np.int32).dtype == np.int32
    k, v = cuda.alloc_kv_cache(2, 16, 2, 64)
    assert k.shape == (2, 16, 2, 64) and k.dtype == np.float16 and v.dtype == np.float16


def test_too_old_gpu_is_refused(monkeypatch) -> None:
    from app.engine.backend.cuda import backend as cuda_module

    monkeypatch.setattr(cuda_module, "_device_summary", lambda _id: ("Old GPU", 75, 8 << 30))
    ok, reason = cuda_module.cuda_available()
    if "CuPy is not installed" in reason or "driver" in reason:
        pytest.skip(reason)
    assert not ok and "7.5" in reason and "8.0" in reason
    with pytest.raises(cuda_module.CudaUnavailableError, match=r"compute capability 7\.5"):
        cuda_module.CudaBackend()

"""Fixtures of the GPU suite: skipped wherever CuPy finds no usable GPU."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_samples import fresh_rng

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cuda import cuda_available


@pytest.fixture(scope="session")
def cuda():
    ok, reason = cuda_available()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}")
    from app.engine.backend.cuda import CudaBackend

    return CudaBackend()


@pytest.fixture(scope="session")
def cpu() -> CpuBackend:
    return CpuBackend()


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Fresh random inputs for every test; the seed is attached to the report for replay."""
    generator, seed = fresh_rng()
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return generator

"""Fixtures of the GPU suite: skipped wherever CuPy finds no usable GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda_samples import fresh_rng

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.cuda.backend import cuda_available

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def cuda():
    ok, reason = cuda_available()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}")
    from app.engine.backend.cuda.backend import CudaBackend

    return CudaBackend()


@pytest.fixture(scope="session")
def cpu() -> CpuBackend:
    return CpuBackend()


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Fresh random inputs for every test; the seed is attached to the report for replay."""
    generator, seed = fresh_rng(request.node.nodeid)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return generator


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, cuda) -> str:
    """A tiny random-weight Qwen3-shaped Q4_K_M GGUF (bench/make_random_gguf.py)."""
    pytest.importorskip("gguf")
    spec = importlib.util.spec_from_file_location("make_random_gguf", ROOT / "bench" / "make_random_gguf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    module.write("tiny", "q4_k_m", path)
    return str(path)

"""The CUDA backend's whole-block copies for the offload tiers (pinned host rows, copies on the current
stream) against the numpy backend's (FP8 caches' payloads: test_cuda_kv_fp8.py), and an unknown KV dtype
refused with a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.kv_blocks import block_nbytes
from app.engine.cache.offload import DeviceBlocks, HostTier, KVTiers
from app.engine.cache.radix import EvictedBlocks

pytestmark = pytest.mark.gpu


def _caches(backend, rng, n_layers=3, num_blocks=8):
    caches = []
    for _ in range(n_layers):
        k, v = backend.alloc_kv_cache(num_blocks, 16, 2, 64)
        k[...] = backend.from_host(rng.standard_normal(k.shape).astype(np.float16))
        v[...] = backend.from_host(rng.standard_normal(v.shape).astype(np.float16))
        caches.append((k, v))
    return caches


def test_block_payloads_match_the_numpy_layout_and_round_trip(cuda, cpu, rng) -> None:
    gpu = _caches(cuda, rng)
    host = [tuple(cuda.to_host(a) for a in layer) for layer in gpu]
    rows = cuda.alloc_host_blocks(3, block_nbytes(gpu))
    cuda.read_kv_blocks(gpu, [5, 1, 6], rows)
    cuda.sync_kv_copies()
    expected = cpu.alloc_host_blocks(3, block_nbytes(host))
    cpu.read_kv_blocks(host, [5, 1, 6], expected)
    np.testing.assert_array_equal(rows, expected)
    cuda.write_kv_blocks(gpu, [2, 3, 4], rows)
    for layer, copy in zip(gpu, host, strict=True):
        for device, before in zip(layer, copy, strict=True):
            np.testing.assert_array_equal(cuda.to_host(device)[[2, 3, 4]], before[[5, 1, 6]])


def test_a_spilled_block_survives_its_reuse_and_comes_back(cuda, rng) -> None:
    gpu = _caches(cuda, rng)
    before = cuda.to_host(gpu[0][0])[3].copy()
    copier = DeviceBlocks(cuda, gpu)
    tiers = KVTiers(copier, 16, HostTier(4, copier), None)
    tokens = tuple(range(16))
    tiers.spill(EvictedBlocks(None, tokens, [3]))
    gpu[0][0][3] = 0  # the pool reuses the block right after (same stream: the copy went first)
    hits = tiers.fetch(None, tokens, 0, 1)
    tiers.load(hits, [7])
    np.testing.assert_array_equal(cuda.to_host(gpu[0][0])[7], before)


def test_an_unknown_kv_dtype_is_refused_clearly_on_cuda(cuda) -> None:
    with pytest.raises(ValueError, match="not on CUDA; choose auto, float16 or fp8"):
        cuda.alloc_kv_cache(2, 16, 2, 64, "float32")

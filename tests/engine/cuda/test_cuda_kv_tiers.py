"""The CUDA backend's whole-block copies for the offload tiers (pinned host rows, copies on the current
stream) against the numpy backend's (FP8 caches' payloads: test_cuda_kv_fp8.py), and an unknown KV dtype
refused with a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.kv_blocks import block_nbytes
from app.engine.cache.disk_tier import DiskTier
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


@pytest.mark.parametrize("piece_blocks", [None, 7])
def test_many_blocks_round_trip_through_scattered_rows_in_one_call_each(cuda, cpu, rng, monkeypatch, piece_blocks):
    """40 blocks out to rows in two pinned chunks and pageable memory, in an order that makes runs of
    adjacent rows and single ones, then back into other blocks: one read and one write (staged whole,
    or in pieces of 7 blocks)."""
    gpu = _caches(cuda, rng, num_blocks=96)
    host = [tuple(cuda.to_host(a) for a in layer) for layer in gpu]
    nbytes = block_nbytes(gpu)
    if piece_blocks:
        monkeypatch.setattr("app.engine.backend.cuda.backend.KV_STAGING_BYTES", piece_blocks * nbytes)
    first, second = cuda.alloc_host_blocks(24, nbytes), cuda.alloc_host_blocks(24, nbytes)
    pageable = np.zeros((4, nbytes), np.uint8)
    rows = [*first[:12], *(second[i] for i in (5, 3, 9, 0, 1, 2)), *pageable, *first[12:20], *second[10:20]]
    assert len(rows) == 40
    ids = rng.permutation(96)[:40].tolist()
    cuda.read_kv_blocks(gpu, ids, rows)
    cuda.sync_kv_copies()
    expected = cpu.alloc_host_blocks(40, nbytes)
    cpu.read_kv_blocks(host, ids, expected)
    np.testing.assert_array_equal(np.stack(rows), expected)
    targets = [b for b in range(96) if b not in ids][:40]
    cuda.write_kv_blocks(gpu, targets, rows)
    cuda.sync_kv_copies()
    for layer, copy in zip(gpu, host, strict=True):
        for device, before in zip(layer, copy, strict=True):
            np.testing.assert_array_equal(cuda.to_host(device)[targets], before[ids])


def test_a_prefix_comes_back_from_host_rows_and_disk_files_together(cuda, rng, tmp_path) -> None:
    gpu = _caches(cuda, rng, num_blocks=64)
    before = [tuple(cuda.to_host(a)[:24] for a in layer) for layer in gpu]
    copier = DeviceBlocks(cuda, gpu)
    disk = DiskTier(tmp_path, 1 << 30, b"\x01" * 32, copier.block_nbytes)
    tiers = KVTiers(copier, 16, HostTier(16, copier), disk)
    tokens = tuple(range(24 * 16))
    tiers.spill(EvictedBlocks(None, tokens, list(range(24))))  # 8 go on to disk
    for layer in gpu:
        for array in layer:
            array[:24] = 0  # the pool reuses the blocks
    hits = tiers.fetch(None, tokens, 0, 24)
    assert [h.tier for h in hits] == ["disk"] * 8 + ["host"] * 16
    tiers.load(hits, list(range(30, 54)))
    for layer, copy in zip(gpu, before, strict=True):
        for device, want in zip(layer, copy, strict=True):
            np.testing.assert_array_equal(cuda.to_host(device)[30:54], want)
    tiers.check_integrity()
    disk.close()


def test_an_unknown_kv_dtype_is_refused_clearly_on_cuda(cuda) -> None:
    with pytest.raises(ValueError, match="not on CUDA; choose auto, float16 or fp8"):
        cuda.alloc_kv_cache(2, 16, 2, 64, "float32")

"""The CUDA backend's tier copies (`read_kv_blocks` / `write_kv_blocks`) run here without a GPU, over a
stand-in device: arrays in host memory, `cudaMemcpyAsync` a memmove by address. What this checks is the
backend's own logic: staging in pieces of KV_STAGING_BYTES, one copy per run of adjacent host rows, one
scatter or gather per cache leaf and piece, every row landing in its block. The real copies are checked
on the GPU by test_cuda_kv_tiers.py."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from app.engine.backend import kv_blocks
from app.engine.backend.cuda import backend as cuda_backend


class DeviceArray(np.ndarray):
    """A stand-in device array: `.data.ptr` as CuPy's, and indexings by block ids counted."""

    indexings = 0

    @property
    def data(self):  # as CuPy's MemoryPointer: .ptr
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def __getitem__(self, key):
        if isinstance(key, np.ndarray):
            DeviceArray.indexings += 1
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if isinstance(key, np.ndarray):
            DeviceArray.indexings += 1
        super().__setitem__(key, value)


class Event:
    done = True

    def synchronize(self) -> None:
        pass


class Stream:
    ptr = 0

    def record(self) -> Event:
        return Event()


class StandIn:
    """The few `xp` (CuPy) calls the tier copies make, over host memory."""

    uint8, int64 = np.uint8, np.int64
    cuda = types.SimpleNamespace(get_current_stream=Stream)

    @staticmethod
    def empty(shape, dtype):
        return np.empty(shape, dtype).view(DeviceArray)

    @staticmethod
    def asarray(a):
        return np.asarray(a).view(DeviceArray)

    @staticmethod
    def ascontiguousarray(a):
        return np.ascontiguousarray(a).view(DeviceArray)


@pytest.fixture
def backend(monkeypatch):
    """A CudaBackend whose `xp` is the stand-in, and the copies it makes, (kind, bytes) each."""
    copies: list[tuple[int, int]] = []

    def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        copies.append((kind, nbytes))
        ctypes.memmove(dst, src, nbytes)

    runtime = types.SimpleNamespace(memcpyDeviceToHost=2, memcpyHostToDevice=1, memcpyAsync=memcpy_async)
    cupy_cuda = types.ModuleType("cupy.cuda")
    cupy_cuda.runtime = runtime
    cupy = types.ModuleType("cupy")
    cupy.cuda = cupy_cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy_cuda)
    device = object.__new__(cuda_backend.CudaBackend)  # no device to initialise: only the copy state
    device.xp, device._staged, device._copied = StandIn, [], None
    return device, copies


def caches(rng, num_blocks: int = 40) -> list:
    return [tuple(rng.standard_normal((num_blocks, 16, 2, 8)).astype(np.float16).view(DeviceArray) for _ in "kv")
            for _ in range(3)]  # fmt: skip


@pytest.mark.parametrize("piece_blocks", [None, 3])
def test_rows_go_out_and_back_in_runs_and_pieces(backend, monkeypatch, piece_blocks) -> None:
    device, copies = backend
    rng = np.random.default_rng(0)
    kv = caches(rng)
    nbytes = kv_blocks.block_nbytes(kv)
    leaves = len(kv_blocks.cache_leaves(kv))
    if piece_blocks:
        monkeypatch.setattr(cuda_backend, "KV_STAGING_BYTES", piece_blocks * nbytes)
    chunk, pageable = np.zeros((30, nbytes), np.uint8), np.zeros((2, nbytes), np.uint8)
    rows = [*chunk[:10], *(chunk[i] for i in (20, 15, 16)), *pageable, *chunk[10:15]]  # 5 runs of adjacent rows
    ids = list(range(5, 25))
    expected = kv_blocks.gather_blocks(np, [tuple(np.asarray(a) for a in pair) for pair in kv], np.array(ids))
    DeviceArray.indexings = 0
    device.read_kv_blocks(kv, ids, rows)
    device.sync_kv_copies()
    np.testing.assert_array_equal(np.stack(rows), expected)
    pieces = -(-len(ids) // piece_blocks) if piece_blocks else 1
    assert DeviceArray.indexings == pieces * leaves  # one gather per leaf and piece
    assert len(copies) == (10 if piece_blocks else 5) and {kind for kind, _ in copies} == {2}
    assert sum(n for _, n in copies) == len(ids) * nbytes
    copies.clear()
    DeviceArray.indexings = 0
    targets = [*range(25, 40), 0, 1, 2, 3, 4]
    device.write_kv_blocks(kv, targets, rows)
    device.sync_kv_copies()
    assert DeviceArray.indexings == pieces * leaves  # one scatter per leaf and piece
    assert {kind for kind, _ in copies} == {1} and sum(n for _, n in copies) == len(ids) * nbytes
    for pair in kv:
        for leaf in pair:
            np.testing.assert_array_equal(np.asarray(leaf)[targets], np.asarray(leaf)[ids])
    assert device._staged == [] and device._copied is None


def test_wrong_rows_are_refused_before_any_copy(backend) -> None:
    device, copies = backend
    kv = caches(np.random.default_rng(1), num_blocks=4)
    nbytes = kv_blocks.block_nbytes(kv)
    with pytest.raises(ValueError, match="1 host rows for 2 KV blocks"):
        device.write_kv_blocks(kv, [0, 1], [np.zeros(nbytes, np.uint8)])
    with pytest.raises(ValueError, match="contiguous uint8 bytes"):
        device.read_kv_blocks(kv, [0], [np.zeros((2, nbytes), np.uint8)[:, 0]])
    assert copies == []

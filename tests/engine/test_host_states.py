"""worker/host_states.py on the CPU backend: spilled snapshot rows come back into other rows bit for bit,
across state arrays of different shapes, and a spill does not disturb the other host rows."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend.cpu import CpuBackend
from app.engine.worker.host_states import HostStates


def state_arrays(rng: np.random.Generator, rows: int) -> list[np.ndarray]:
    """Two layers' (conv state, recurrent state) arrays of a tiny hybrid model, random rows."""
    shapes = [(6, 3), (2, 4, 5), (6, 3), (2, 4, 5)]
    return [rng.standard_normal((rows, *shape)).astype(np.float32) for shape in shapes]


def test_spilled_rows_load_back_into_other_rows() -> None:
    rng = np.random.default_rng(0)
    arrays = state_arrays(rng, 8)
    host = HostStates(CpuBackend(), arrays, rows=3)
    before = [a.copy() for a in arrays]
    host.spill([(5, 2), (6, 0)])
    for a in arrays:  # the device rows are reused by the step's saves
        a[5:7] = 0
    host.wait_spills()
    host.load([(2, 1), (0, 3)])
    for a, b in zip(arrays, before, strict=True):
        np.testing.assert_array_equal(a[1], b[5])
        np.testing.assert_array_equal(a[3], b[6])
    row_bytes = sum(a[0].nbytes for a in arrays)
    assert host.bytes_spilled == 2 * row_bytes and host.bytes_loaded == 2 * row_bytes
    # host row 1 was never written: still the zeros it was allocated as
    assert not host.row(1).any()


def test_rows_come_in_chunks_made_ahead_of_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host rows' chunks are made on a thread from the start (cache/host_chunks.py), each once."""
    arrays = state_arrays(np.random.default_rng(1), 2)
    row_bytes = sum(a[0].nbytes for a in arrays)
    monkeypatch.setattr("app.engine.worker.host_states.HOST_CHUNK_BYTES", 2 * row_bytes)  # two rows a chunk
    allocated: list[int] = []
    backend = CpuBackend()
    alloc = backend.alloc_host_blocks
    monkeypatch.setattr(backend, "alloc_host_blocks", lambda n, nbytes: allocated.append(n) or alloc(n, nbytes))
    host = HostStates(backend, arrays, rows=5)
    assert [host.view(4, i).shape for i in range(4)] == [a.shape[1:] for a in arrays]
    host.spill([(0, 0), (1, 1)])
    np.testing.assert_array_equal(host.view(1, 1), arrays[1][1])
    host.chunks.close()
    host.row(3)  # made now if the thread had not got to it
    assert sorted(allocated) == [1, 2, 2] and len(host.chunks) == 3  # every chunk made once, the last short
    with pytest.raises(IndexError, match="host row 5 outside the tier's 5 rows"):
        host.row(5)

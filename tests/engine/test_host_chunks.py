"""cache/host_chunks.py: host rows in chunks, made in order on a thread from the start."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.engine.cache.host_chunks import HostChunks

ROW_BYTES = 8


class CountingAlloc:
    """alloc(rows) as a backend's alloc_host_blocks, recording each call; optionally slow, to interleave."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[int] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, rows: int) -> np.ndarray:
        time.sleep(self.delay)
        with self.lock:
            self.calls.append(rows)
        return np.zeros((rows, ROW_BYTES), np.uint8)


def _wait_all(chunks: HostChunks, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while len(chunks) < chunks.num_chunks and time.monotonic() < deadline:
        time.sleep(0.01)


def test_every_chunk_is_made_ahead_of_need_once() -> None:
    alloc = CountingAlloc()
    chunks = HostChunks(alloc, num_rows=10, chunk_rows=3)  # chunks of 3, 3, 3, 1 rows
    assert chunks.num_chunks == 4
    chunks.row(4)[...] = 7
    _wait_all(chunks)
    chunks.close()
    assert len(chunks) == 4 and chunks.made_rows == 10
    assert sorted(alloc.calls) == [1, 3, 3, 3]  # each chunk made once, the last one short
    assert (chunks.row(4) == 7).all() and not chunks.row(3).any() and not chunks.row(5).any()


def test_a_chunk_the_thread_cannot_make_is_made_or_refused_where_it_is_asked_for() -> None:
    calls: list[int] = []

    def refusing(rows: int) -> np.ndarray:
        calls.append(rows)
        if len(calls) == 1:
            raise MemoryError("no pinned memory left")
        return np.zeros((rows, ROW_BYTES), np.uint8)

    chunks = HostChunks(refusing, num_rows=4, chunk_rows=2)
    chunks.close()  # the thread stopped at its first failure
    assert len(chunks) == 0
    assert chunks.row(3).shape == (ROW_BYTES,) and len(chunks) == 1


def test_without_ahead_only_the_chunks_asked_for_are_made() -> None:
    alloc = CountingAlloc()
    chunks = HostChunks(alloc, num_rows=10, chunk_rows=3, ahead=False)
    chunks.row(9)
    chunks.row(0)
    assert len(chunks) == 2 and sorted(alloc.calls) == [1, 3]


def test_rows_asked_for_while_the_thread_makes_chunks_are_made_once_and_kept() -> None:
    """The step loop asks for rows from the far end while the thread walks from the start: every chunk is
    made exactly once, and a row written before the thread got to its chunk keeps its bytes."""
    alloc = CountingAlloc(delay=0.002)
    chunks = HostChunks(alloc, num_rows=64, chunk_rows=2)
    for row in range(63, -1, -5):
        chunks.row(row)[...] = row
    _wait_all(chunks)
    chunks.close()
    assert len(alloc.calls) == 32 and chunks.made_rows == 64
    for row in range(63, -1, -5):
        assert (chunks.row(row) == row).all()


def test_close_stops_making_chunks_ahead() -> None:
    alloc = CountingAlloc(delay=0.01)
    chunks = HostChunks(alloc, num_rows=1000, chunk_rows=1)
    chunks.close()
    made = len(chunks)
    assert made < 1000
    time.sleep(0.05)
    assert len(chunks) == made  # nothing after close returned


def test_rows_outside_the_tier_are_refused() -> None:
    chunks = HostChunks(CountingAlloc(), num_rows=4, chunk_rows=2, ahead=False)
    with pytest.raises(IndexError, match="host row 4"):
        chunks.row(4)
    with pytest.raises(IndexError, match="host chunk 2"):
        chunks.chunk(2)
    with pytest.raises(ValueError, match="chunk_rows"):
        HostChunks(CountingAlloc(), num_rows=4, chunk_rows=0)

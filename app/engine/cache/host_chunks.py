"""Rows of host memory in chunks: the first chunk made on first need, the rest ahead of need on a thread.

The host tiers (offload.HostTier's KV blocks, worker/host_states.py's recurrent-state snapshots) keep their
rows in pinned memory on CUDA, since asynchronous copies need pinned pages. Pinning has a price: the driver
maps and locks every page, tens of milliseconds per hundred megabytes. Made on the step loop at the moment a
row was first needed, a wave of evictions paid it inside the steps, chunk after chunk: a Qwen3.5-27B state
row is ~157 MB (one row a chunk), and a wave of 32 requests spilled ~27 of them while its first tokens waited.

So a tier that is never used pins nothing (no chunk exists before the first need), and from the first need on
a thread makes the remaining chunks in order, so that later rows are normally ready before they are asked
for. A row asked for before the thread reached its chunk is made on the spot, as before; it waits at most for
the one chunk the thread is making (one lock guards the making of chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np


class HostChunks:
    """`num_rows` rows in chunks of `chunk_rows`, each chunk `alloc(rows)`: an array `[rows, row_bytes]`."""

    def __init__(
        self, alloc: Callable[[int], np.ndarray], num_rows: int, chunk_rows: int, ahead: bool = True
    ) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, not {chunk_rows}")
        self._alloc = alloc
        self.num_rows = num_rows
        self.chunk_rows = chunk_rows
        self.num_chunks = -(-num_rows // chunk_rows)
        self._chunks: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()  # held while a chunk is made, by either thread
        self._ahead = ahead
        self._thread: threading.Thread | None = None
        self._stop = False

    def __len__(self) -> int:
        """Chunks made so far."""
        return len(self._chunks)

    @property
    def made_rows(self) -> int:
        return sum(len(chunk) for chunk in list(self._chunks.values()))

    def chunk(self, index: int) -> np.ndarray:
        """Chunk `index` (rows index * chunk_rows ...), made now if the thread has not made it yet."""
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"host chunk {index} outside the tier's {self.num_chunks} chunks")
        chunk = self._chunks.get(index)
        if chunk is None:
            chunk = self._make(index)
            self._start_ahead()
        return chunk

    def row(self, row: int) -> np.ndarray:
        """Row `row`, a view into its chunk."""
        if not 0 <= row < self.num_rows:
            raise IndexError(f"host row {row} outside the tier's {self.num_rows} rows")
        index, offset = divmod(row, self.chunk_rows)
        return self.chunk(index)[offset]

    def close(self) -> None:
        """Stop making chunks ahead and wait for the one being made (engine shutdown, tests)."""
        self._stop = True
        if self._thread is not None:
            self._thread.join()

    def _make(self, index: int) -> np.ndarray:
        with self._lock:
            chunk = self._chunks.get(index)
            if chunk is None:
                rows = min(self.chunk_rows, self.num_rows - index * self.chunk_rows)
                chunk = self._chunks[index] = self._alloc(rows)
        return chunk

    def _start_ahead(self) -> None:
        if self._ahead and self._thread is None and len(self._chunks) < self.num_chunks:
            # Not a daemon: a thread inside the CUDA driver at interpreter exit can crash it. It stops once
            # the main thread has ended, so an exiting process waits for at most the chunk being made.
            self._thread = threading.Thread(target=self._make_rest, name="paddock-host-chunks")
            self._thread.start()

    def _make_rest(self) -> None:
        for index in range(self.num_chunks):
            if self._stop or not threading.main_thread().is_alive():
                return
            if index not in self._chunks:
                self._make(index)

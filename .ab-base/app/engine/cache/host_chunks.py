"""Rows of host memory in chunks, made in order on a thread from the start.

The host tiers (offload.HostTier's KV blocks, worker/host_states.py's recurrent-state snapshots) keep their
rows in pinned memory on CUDA, since asynchronous copies need pinned pages. Pinning has a price: the driver
maps and locks every page, ~1.5 GB/s on the H100 machine (a 256 MB chunk took 170 ms inside a step,
bench/results/gpu-s17-2026-12-06.md). Made on the step loop when a row was first needed, a wave of
evictions paid it inside its steps: a Qwen3.5-27B state row is ~157 MB, and a wave of 32 requests spilled ~27
of them (~2.8 s of pinning) while its first tokens waited.

So a tier's chunks are made on a thread from the moment the tier exists (the tier's size is the user's
--kv-host-gb: that memory is theirs to give), in order, while the engine loads and warms up. A row asked for
before the thread reached its chunk is made on the spot; it waits at most for the one chunk the thread is
making (one lock guards the making of chunks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)


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
        self._thread: threading.Thread | None = None
        self._stop = False
        if ahead and self.num_chunks:
            # Not a daemon: a thread inside the CUDA driver at interpreter exit can crash it. It stops once
            # the main thread has ended, so an exiting process waits for at most the chunk being made.
            self._thread = threading.Thread(target=self._make_all, name="paddock-host-chunks")
            self._thread.start()

    def __len__(self) -> int:
        """Chunks made so far."""
        return len(self._chunks)

    @property
    def making_ahead(self) -> bool:
        """Whether the thread is still making chunks."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def made_rows(self) -> int:
        return sum(len(chunk) for chunk in list(self._chunks.values()))

    def chunk(self, index: int) -> np.ndarray:
        """Chunk `index` (rows index * chunk_rows ...), made now if the thread has not made it yet."""
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"host chunk {index} outside the tier's {self.num_chunks} chunks")
        chunk = self._chunks.get(index)
        return chunk if chunk is not None else self._make(index)

    def row(self, row: int) -> np.ndarray:
        """Row `row`, a view into its chunk."""
        if not 0 <= row < self.num_rows:
            raise IndexError(f"host row {row} outside the tier's {self.num_rows} rows")
        index, offset = divmod(row, self.chunk_rows)
        return self.chunk(index)[offset]

    def close(self) -> None:
        """Stop making chunks ahead of need and wait for the one being made (engine shutdown, tests)."""
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

    def _make_all(self) -> None:
        for index in range(self.num_chunks):
            if self._stop or not threading.main_thread().is_alive():
                return
            if index not in self._chunks:
                try:
                    self._make(index)
                except Exception as exc:  # e.g. pinned memory refused: a row asked for later raises it there
                    log.warning("host tier: chunk %d of %d not made ahead of need: %s", index, self.num_chunks, exc)
                    return

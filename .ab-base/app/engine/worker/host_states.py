"""The host-RAM tier of a hybrid model's state snapshots: rows of every recurrent layer's state in host memory.

A row's payload is every state array's row laid end to end (`runner.state_arrays` order), in memory from
`backend.alloc_host_blocks` (pinned on CUDA), in chunks of about HOST_CHUNK_BYTES made on a thread from
the start (cache/host_chunks.py: pinning gigabytes takes seconds, which a step must not wait for). The state cache (cache/state_cache.py) names the rows; this
module moves the bytes: a spill copies evicted device snapshot rows out, a load copies a host row into a
request's slot.

On CUDA neither waits for the GPU. A spill is copied on a side stream that first waits for the compute
stream (everything enqueued before it, the step's loads included, is done), so the step's forward runs
beside the PCIe copies; the compute stream waits for them (`wait_spills`) before the step's saves, which
overwrite the spilled rows, and before any later load, which may read a row a spill wrote. A load is an
asynchronous copy from pinned memory on the compute stream, ordered with everything around it. (Before,
each array's rows came back with a blocking copy into pageable memory and a numpy scatter: ~150 MB a
Qwen3.5-27B row, tens of milliseconds each, every eviction stalling the step.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.cache.host_chunks import HostChunks
from app.engine.cache.offload import HOST_CHUNK_BYTES


class HostStates:
    def __init__(self, backend: Any, arrays: list[Any], rows: int) -> None:
        self.backend, self.arrays = backend, arrays
        self.widths = [int(a[0].nbytes) for a in arrays]
        self.offsets = np.concatenate([[0], np.cumsum(self.widths)]).astype(int).tolist()
        self.num_rows = rows if arrays else 0
        self.row_bytes = self.offsets[-1]
        self.chunk_rows = max(1, HOST_CHUNK_BYTES // max(1, self.row_bytes))
        self.chunks = HostChunks(lambda rows: backend.alloc_host_blocks(rows, self.row_bytes), self.num_rows,
                                 self.chunk_rows)  # fmt: skip
        self.cuda = backend.name == "cuda"
        if self.cuda:  # rows are copied by address: each array's row i starts i * width bytes in
            assert all(a.flags.c_contiguous for a in arrays), "state arrays must be C-contiguous"
        self._stream: Any = None  # the side stream spills copy on (CUDA, made on first use)
        self._spilled: Any = None  # an event after the latest spill's copies (CUDA)
        self.bytes_spilled = 0
        self.bytes_loaded = 0

    def row(self, host_row: int) -> np.ndarray:
        """`host_row`'s payload, uint8 `[row_bytes]`."""
        return self.chunks.row(host_row)

    def view(self, host_row: int, i: int) -> np.ndarray:
        """Array i's part of `host_row`, shaped as one row of it."""
        part = self.row(host_row)[self.offsets[i] : self.offsets[i + 1]]
        return part.view(self.arrays[i].dtype).reshape(self.arrays[i].shape[1:])

    def spill(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device rows into host rows, (device row, host row) each; on CUDA without waiting."""
        if not pairs:
            return
        if not self.cuda:
            for row, host_row in pairs:
                for i, array in enumerate(self.arrays):
                    self.view(host_row, i)[...] = array[row]
        else:
            import cupy

            if self._stream is None:
                self._stream = cupy.cuda.Stream(non_blocking=True)
            ready = cupy.cuda.get_current_stream().record()
            self._stream.wait_event(ready)
            self._copy([(host_row, row) for row, host_row in pairs], to_host=True, stream=self._stream)
            self._spilled = self._stream.record()
        self.bytes_spilled += len(pairs) * self.row_bytes

    def wait_spills(self) -> None:
        """Order the compute stream after the spills so far (CUDA; a no-op elsewhere, and when none is in flight)."""
        if self._spilled is not None:
            import cupy

            cupy.cuda.get_current_stream().wait_event(self._spilled)
            self._spilled = None

    def load(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host rows into device rows (a request's slot), (host row, device row) each."""
        if not pairs:
            return
        self.wait_spills()  # a spill of an earlier step may have written the row
        if self.cuda:
            import cupy

            self._copy(pairs, to_host=False, stream=cupy.cuda.get_current_stream())  # from pinned: asynchronous
        else:
            for host_row, row in pairs:
                for i, array in enumerate(self.arrays):
                    array[row] = self.view(host_row, i)
        self.bytes_loaded += len(pairs) * self.row_bytes

    def _copy(self, pairs: list[tuple[int, int]], to_host: bool, stream: Any) -> None:
        """CUDA: one asynchronous copy per (host row, device row) pair and array, by address (a raw
        cudaMemcpyAsync: ~3,000 of them for 32 Qwen3.5-27B rows, where CuPy's get/set cost ~15 us each)."""
        from cupy.cuda import runtime

        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        for host_row, row in pairs:
            host = self.row(host_row).ctypes.data
            for array, offset, width in zip(self.arrays, self.offsets, self.widths, strict=False):
                device = array.data.ptr + row * width
                dst, src = (host + offset, device) if to_host else (device, host + offset)
                runtime.memcpyAsync(dst, src, width, kind, stream.ptr)

"""CUDA-graph replay of decode steps: one launch per step instead of hundreds.

A decode step (every sequence adds one token) is captured once per batch-size bucket,
reading its inputs from static device buffers. Per step the runner copies the step's
few integers into those buffers (one host-to-device copy) and replays the bucket's graph;
padding rows of a bucket point at the reserved null KV block 0, whose contents nobody
reads. Attention is planned for the longest context the engine allows, so one graph
serves every context length (splits past a sequence's end exit at once).

Capture runs on a side stream (the legacy default stream cannot capture); replays run on
the default stream, in order with eager prefill steps and the sampler. Captured kernels
write their intermediates into memory-pool blocks of the side stream; CuPy's pool reuses a
stream's freed blocks only for that stream, so eager steps never alias them, and buckets,
captured one after another, share them (they never run at the same time). The static
inputs and the logits outputs are held here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata

log = logging.getLogger(__name__)


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then of 32: small steps where decode is latency-bound."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + (8 if sizes[-1] < 64 else 32))
    return [s for s in sizes if s < max_batch] + [max_batch]


class DecodeGraphs:
    def __init__(
        self, model: Any, backend: Any, kv_caches: list, block_size: int, max_model_len: int, max_batch: int
    ):
        xp = backend.xp
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.block_size, self.max_model_len = block_size, max_model_len
        self.buckets = bucket_sizes(max_batch)
        biggest = self.buckets[-1]
        self.max_blocks = -(-max_model_len // block_size)
        # One pinned host staging area and one device area: [ids | positions | slots | seq_lens | tables].
        self._width = 4 + self.max_blocks
        self._host = _pinned_int32(xp, biggest * self._width)
        self._device = xp.zeros(biggest * self._width, dtype=xp.int32)
        self._query_start_loc = xp.arange(biggest + 1, dtype=xp.int32)
        self._graphs: dict[int, tuple[Any, Any]] = {}

    def capture(self) -> None:
        """Capture every bucket, largest first (so the pool's blocks fit the smaller ones)."""
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            for n in reversed(self.buckets):
                self._forward(n)  # warm-up: compiles kernels and sizes the pool's blocks
                stream.synchronize()
                stream.begin_capture()
                logits = self._forward(n)
                graph = stream.end_capture()
                graph.upload()
                self._graphs[n] = (graph, logits)
        stream.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", self.buckets)

    def bucket_for(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def run(
        self, token_ids: np.ndarray, positions: np.ndarray, seq_lens: np.ndarray, tables: np.ndarray
    ) -> Any:
        """Logits `[n, vocab]` of one decode step of `n` sequences (host arrays in, device array out)."""
        n = len(token_ids)
        bucket = self.bucket_for(n)
        graph, logits = self._graphs[bucket]
        staged = self._host[: bucket * self._width].reshape(bucket, self._width)
        staged[:] = 0
        staged[:n, 0] = token_ids
        staged[:n, 1] = positions
        staged[:, 3] = 1  # padding rows: one key, in the null block
        staged[:n, 3] = seq_lens
        staged[:n, 4 : 4 + tables.shape[1]] = tables
        bs = self.block_size
        staged[:n, 2] = tables[np.arange(n), positions // bs] * bs + positions % bs
        # Replays go on the default stream, in order with the eager steps and the sampler.
        null = self.backend.xp.cuda.Stream.null
        self._device[: staged.size].set(staged.reshape(-1), stream=null)
        graph.launch(stream=null)
        return logits[:n]

    def _forward(self, n: int) -> Any:
        columns = self._device[: n * self._width].reshape(n, self._width)
        # Strided column views would not be contiguous: the kernels take contiguous copies,
        # made inside the graph from the staged rows.
        xp = self.backend.xp
        token_ids, positions = xp.ascontiguousarray(columns[:, 0]), xp.ascontiguousarray(columns[:, 1])
        meta = AttentionMetadata(
            query_start_loc=self._query_start_loc[: n + 1],
            seq_lens=xp.ascontiguousarray(columns[:, 3]),
            block_tables=xp.ascontiguousarray(columns[:, 4:]),
            slot_mapping=xp.ascontiguousarray(columns[:, 2]),
            positions=positions,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            block_size=self.block_size,
        )
        hidden = self.model.forward(token_ids, meta, self.kv_caches)
        return self.model.logits(hidden)


def _pinned_int32(xp: Any, size: int) -> np.ndarray:
    memory = xp.cuda.alloc_pinned_memory(size * 4)
    return np.frombuffer(memory, dtype=np.int32, count=size)

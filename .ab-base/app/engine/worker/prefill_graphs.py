"""CUDA-graph replay of one sequence's prefill: the first token of a lone prompt without
hundreds of Python launches.

Run eagerly, a prefill step of a small model is bound by Python, not by the GPU: ~11 ms
for a 147-token prompt on Qwen3-0.6B (docs/tuning-log.md), most of a
request's time to first token, against ~1 ms of kernels. The desktop's common case (one
prompt at a time: a chat, an agent's turn) is one sequence's chunk of up to a few hundred
tokens, so that case is captured once per token-count bucket and replayed.

A chunk of `n` tokens runs in the smallest bucket `T >= n` as one sequence of `T` tokens:
the `T - n` padding tokens follow the real ones at the next positions, so causal attention
keeps every real token blind to them. Their keys and values land either in the request's
own last block, in slots that its next decode steps overwrite before anyone reads them, or,
past its allocated blocks (table entries 0), in the reserved null block 0. The scheduler
counts only the real tokens as computed, so the prefix cache never takes a padded slot.
Only the last real token's logits are computed (its row is an input of the graph).

Prefill graphs are an addition to the decode graphs (EngineConfig.prefill_graphs, on by default
with `cuda_graphs`). Like
DecodeGraphs: static inputs laid out field by field in one device buffer
([ids | positions | slots | seq_len | query_start_loc | sample row | table]), filled by one
host-to-device copy per step, and capture on a side stream with programmatic launches.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, Backend
from app.engine.cache.block_table import block_table_array
from app.engine.worker.decode_graphs import capture_buckets, capture_if_room

log = logging.getLogger(__name__)

BUCKETS = (16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)


class PrefillGraphs:
    def __init__(
        self, model: Any, backend: Backend, kv_caches: list, block_size: int, max_model_len: int,
        buckets: tuple[int, ...] = BUCKETS,
    ) -> None:  # fmt: skip
        xp = backend.xp
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.block_size, self.max_model_len = block_size, max_model_len
        self.buckets = tuple(b for b in buckets if b <= max_model_len)
        self.max_blocks = -(-max_model_len // block_size)
        self._size = 3 * self.buckets[-1] + 4 + self.max_blocks if self.buckets else 0
        self._host = np.frombuffer(
            xp.cuda.alloc_pinned_memory(max(self._size, 1) * 4), np.int32, max(self._size, 1)
        )
        self._device = xp.zeros(max(self._size, 1), dtype=xp.int32)
        self._graphs: dict[int, tuple[Any, Any]] = {}
        self._copied: Any = None  # event after the last host-to-device copy of the inputs

    def bucket_for(self, num_tokens: int, start: int) -> int | None:
        """The bucket a chunk of `num_tokens` new tokens after `start` computed ones replays in,
        or None (too long, or its padding would run past the longest context)."""
        return next((b for b in self.buckets if b >= num_tokens and start + b <= self.max_model_len), None)

    def capture(self, stream: Any = None) -> None:
        """Capture every bucket, largest first (so the pool's blocks fit the smaller ones), on
        `stream`: the decode graphs' capture stream, whose pool blocks these share (no two
        graphs ever run at once, and eager steps run on the default stream)."""
        import cupy

        cupy.cuda.Device().synchronize()  # see DecodeGraphs.capture: the side stream does not wait
        stream = stream or cupy.cuda.Stream(non_blocking=True)
        # warm-up inputs: a valid chunk of t zeros at position 0, all in the null block
        self._graphs = capture_buckets(
            self.buckets, self._forward, stream, lambda t: self._stage([0] * t, 0, [], t, stream),
            programmatic=self.backend.kernel_options.pdl,
        )  # fmt: skip
        log.info("captured prefill CUDA graphs for chunks of up to %s tokens", self.buckets)

    def run(self, token_ids: list[int], start: int, block_ids: list[int]) -> Any:
        """Logits `[1, vocab]` of the last of `token_ids`, the chunk after `start` computed tokens
        of a sequence whose blocks are `block_ids` (host lists in, device array out)."""
        n = len(token_ids)
        bucket = self.bucket_for(n, start)
        if bucket is None:
            raise ValueError(f"no prefill graph for {n} tokens after {start}")
        graph, logits = self._graphs[bucket]
        null = self.backend.xp.cuda.Stream.null
        self._stage(token_ids, start, block_ids, bucket, null)
        graph.launch(stream=null)
        return logits

    def _stage(
        self, token_ids: list[int], start: int, block_ids: list[int], bucket: int, stream: Any
    ) -> None:
        """Fill bucket's inputs on the host and copy them to the device on `stream`."""
        if self._copied is not None:
            self._copied.synchronize()  # the pinned staging area is free once the last copy ran
        n = len(token_ids)
        ids, pos, slots, seq_len, qsl, row, table = self._fields(self._host, bucket)
        ids[:n] = token_ids
        ids[n:] = 0
        pos[:] = np.arange(start, start + bucket, dtype=np.int32)
        width = min(len(block_ids), self.max_blocks)
        table[:width] = block_table_array(block_ids)[:width]  # the table's int32 copy: no conversion
        table[width:] = 0  # padding past the allocated blocks goes to the null block 0
        bs = self.block_size
        slots[:] = table[pos // bs] * bs + pos % bs
        seq_len[0] = start + bucket
        qsl[:] = (0, bucket)
        row[0] = n - 1
        size = 3 * bucket + 4 + self.max_blocks
        self._device[:size].set(self._host[:size], stream=stream)
        self._copied = self.backend.xp.cuda.Event(disable_timing=True)
        self._copied.record(stream)

    def _fields(self, area: Any, t: int) -> tuple[Any, ...]:
        """Views of bucket t's fields in a staging area (host or device)."""
        return (area[:t], area[t : 2 * t], area[2 * t : 3 * t], area[3 * t : 3 * t + 1],
                area[3 * t + 1 : 3 * t + 3], area[3 * t + 3 : 3 * t + 4],
                area[3 * t + 4 : 3 * t + 4 + self.max_blocks])  # fmt: skip

    def _forward(self, t: int) -> Any:
        token_ids, positions, slots, seq_len, qsl, row, table = self._fields(self._device, t)
        meta = AttentionMetadata(
            query_start_loc=qsl,
            seq_lens=seq_len,
            block_tables=table.reshape(1, self.max_blocks),
            slot_mapping=slots,
            positions=positions,
            max_query_len=t,
            max_seq_len=self.max_model_len,
            block_size=self.block_size,
        )
        hidden = self.model.forward(token_ids, meta, self.kv_caches)
        return self.model.logits(hidden[row])


def capture_prefill_graphs(
    wanted: bool, model: Any, backend: Backend, kv_caches: list, block_size: int, max_model_len: int, stream: Any
) -> PrefillGraphs | None:
    """Captured prefill graphs, or None: not wanted (EngineConfig.prefill_graphs), or no room for
    their buffers on the GPU after the KV cache (eager prefill works the same)."""
    if not wanted:
        return None
    graphs = PrefillGraphs(model, backend, kv_caches, block_size, max_model_len)
    return capture_if_room(graphs, stream, "prefill steps") if graphs.buckets else None

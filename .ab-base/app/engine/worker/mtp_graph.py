"""CUDA-graph replay of the MTP head's chained draft step: one token of one sequence, one launch.

Each MTP draft after the first runs the head (models/mtp.py: its norms, the fusing projection, one
decoder layer, the LM head) on the draft before it and the head's own output at that position
(core/mtp_drafter.py); eagerly that is a few dozen launches for one row, k - 1 times a verify step. The
step is captured once, reading static buffers: the token id, its position, its KV slot, the sequence's
length and block table (one host-to-device copy per step, laid out [id | position | slot | seq_len |
table], as the decode graphs lay out a row) and the hidden row it continues from (a device-to-device copy
from the previous step's output). It puts out the head's normed row and its logits, whose argmax the
drafter reads back (that read is the step's one sync: the next draft is the next step's input).

The head's catch-up over the positions the target computed since the last proposal stays eager: its
length is however many tokens verification kept. Capture shares the decode graphs' side stream and its
pool blocks (no two graphs run at once).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, Backend
from app.engine.cache.block_table import block_table_array
from app.engine.worker.decode_graphs import capture_buckets

log = logging.getLogger(__name__)


class MtpStepGraph:
    def __init__(
        self, head: Any, backend: Backend, cache: tuple[Any, Any], block_size: int, max_model_len: int,
        hidden_size: int,
    ) -> None:  # fmt: skip
        xp = backend.xp
        self.head, self.backend, self.cache = head, backend, cache
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        size = 4 + self.max_blocks
        self._host = np.frombuffer(xp.cuda.alloc_pinned_memory(size * 4), np.int32, size)
        self._device = xp.zeros(size, dtype=xp.int32)
        self._hidden = xp.zeros((1, hidden_size), dtype=xp.float32)  # the row the step continues from
        self._query_start_loc = xp.arange(2, dtype=xp.int32)
        self._graph: Any = None
        self._out: Any = None  # (normed row, logits)
        self._copied: Any = None  # event after the last host-to-device copy of the inputs
        self.replays = 0  # steps replayed (tests read it)

    def capture(self, stream: Any) -> None:
        import cupy

        cupy.cuda.Device().synchronize()  # see DecodeGraphs.capture: the side stream does not wait
        # warm-up inputs: token 0 at position 0 in the null block 0, from a zero row
        graphs = capture_buckets([1], lambda _: self._forward(), stream, lambda _: self._stage(0, 0, [], stream),
                                 programmatic=self.backend.kernel_options.pdl)  # fmt: skip
        self._graph, self._out = graphs[1]
        log.info("captured the MTP head's draft step as a CUDA graph")

    def run(self, token: int, position: int, block_ids: list[int], hidden: Any) -> tuple[Any, Any]:
        """The head's normed row `[1, hidden]` and logits `[1, vocab]` for `token` at `position` of the
        sequence whose blocks are `block_ids`, continuing from `hidden` `[1, hidden]` (device arrays out,
        overwritten by the next replay)."""
        stream = self.backend.xp.cuda.Stream.null  # in order with the target's steps
        self._stage(token, position, block_ids, stream)
        self._hidden[...] = hidden  # a device copy on the null stream, before the replay
        self._graph.launch(stream=stream)
        self.replays += 1
        return self._out

    def _stage(self, token: int, position: int, block_ids: list[int], stream: Any) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # the pinned staging area is free once the last copy ran
        host, bs = self._host, self.block_size
        table = host[4:]
        width = min(len(block_ids), self.max_blocks)
        table[:width] = block_table_array(block_ids)[:width]
        table[width:] = 0  # past the sequence's blocks: the null block 0, as the eager step's table
        host[:4] = token, position, table[position // bs] * bs + position % bs, position + 1
        self._device.set(host, stream=stream)
        self._copied = self.backend.xp.cuda.Event(disable_timing=True)
        self._copied.record(stream)

    def _metadata(self) -> AttentionMetadata:
        d = self._device
        return AttentionMetadata(
            query_start_loc=self._query_start_loc, seq_lens=d[3:4], block_tables=d[4:].reshape(1, self.max_blocks),
            slot_mapping=d[2:3], positions=d[1:2], max_query_len=1, max_seq_len=self.max_model_len,
            block_size=self.block_size,
        )  # fmt: skip

    def _forward(self) -> tuple[Any, Any]:
        normed = self.head(self._device[0:1], self._hidden, self._metadata(), self.cache)
        return normed, self.head.logits(normed)

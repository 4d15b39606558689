"""CUDA-graph replay of speculative verify steps: one launch for a batch of decodes carrying drafts.

A verify step runs each drafting sequence's last sampled token and its k drafts (k+1 rows that all
sample), beside one-row decodes of requests that draft nothing this step and, on a hybrid model, a
rolled-back request's kept tokens before its drafts (core/scheduler.py). Run eagerly, such a step of a
small model is bound by Python's launches, as a decode step would be without its graphs.

A graph holds up to `n` sequences in `T = n * w + 1` token rows, for the decode graphs' batch buckets
up to the speculative batch (at most 8) and row widths `w = k + 1` for k in VERIFY_DRAFTS below the configured
draft count and that count itself (a small set: k adapts per request, and a step takes the smallest
graph its rows fit). The step's chunks are packed first, in order, exactly as an eager step packs
them (the same rows sample), then every unused sequence takes one padding row, and one more padding
sequence takes every row left (at least one: the `+ 1`). Padding sequences write and read only the
null KV block 0 and start from zeros in the null state row 0, as the decode graphs' padding rows do.
Padding never goes inside a real sequence: a recurrent layer runs through a sequence's rows token by
token, so rows after its tokens would carry its state past them (why the prefill graphs, which pad a
sequence, are not for hybrid models). The real rows' attention, KV writes and recurrent state are
therefore those of the eager step, and a hybrid model's checkpoint and rollback of a verify chunk's
state row (cache/state_cache.py, copies the runner makes around the step) work unchanged.

Inputs are laid out field by field in one device buffer, [ids T | positions T | slots T |
query_start_loc n+2 | seq_lens n+1 | state rows n+1 | state starts n+1 | tables (n+1) x max_blocks],
filled by one host-to-device copy per step. Attention runs as a varlen batch planned for the longest
context (as the prefill graphs': splits past a sequence's end exit at once); the recurrent layers read
the sequences' rows, state rows and starts on the device. Every row's logits come out of the graph;
the runner gathers the sampled rows. With `--speculative mtp` (`keep_hidden`) the graphs also put out
every row's final hidden state, which the MTP head reads (core/mtp_drafter.py), and the runner replays
them for every step they hold, plain decodes too: the decode graphs keep no hidden states. Capture shares the decode graphs' side stream and its pool blocks
(no two graphs run at once). Each graph copies its logits (and hidden states) into the first rows of
one output buffer of the largest shape's rows, so its own are pool blocks the next capture reuses: the
graphs keep `max T x vocab` floats in all (Qwen3-8B's vocabulary, batch buckets to 8 and k up to 8: 73
rows, 44 MB, where a buffer per graph would keep 267 rows, 162 MB), for a copy of T rows per replay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, Backend
from app.engine.worker.decode_graphs import bucket_sizes, capture_buckets, capture_if_room

log = logging.getLogger(__name__)

VERIFY_DRAFTS = (2, 4, 8)  # draft counts whose widths get graphs (below the configured count, and it)
# Sequences a verify graph holds at most: past them a step's rows keep the GPU busy without a graph's
# help, and the graphs' rows (output buffer, capture time) grow with the batch; larger steps run eagerly.
MAX_BATCH = 8


def verify_widths(max_drafts: int) -> list[int]:
    """Row widths (k + 1) of the verify graphs for at most `max_drafts` drafts per sequence."""
    if max_drafts < 1:
        raise ValueError(f"verify graphs need at least one draft token, got {max_drafts}")
    return sorted({k + 1 for k in VERIFY_DRAFTS if k < max_drafts} | {max_drafts + 1})


def verify_shapes(max_batch: int, max_drafts: int) -> list[tuple[int, int]]:
    """(rows T, sequences n) of every verify graph, smallest first: n from the decode graphs' buckets up
    to `max_batch` (at most MAX_BATCH), T = n * w + 1 for each width w."""
    buckets = bucket_sizes(min(max_batch, MAX_BATCH))
    return sorted({(n * w + 1, n) for n in buckets for w in verify_widths(max_drafts)})


class VerifyGraphs:
    def __init__(
        self, model: Any, backend: Backend, kv_caches: list, block_size: int, max_model_len: int, max_batch: int,
        max_drafts: int, keep_hidden: bool = False,
    ) -> None:  # fmt: skip
        xp = backend.xp
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.block_size, self.max_model_len = block_size, max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.shapes = verify_shapes(max_batch, max_drafts)
        size = max(self._size(shape) for shape in self.shapes)
        self._host = np.frombuffer(xp.cuda.alloc_pinned_memory(size * 4), np.int32, size)
        self._device = xp.zeros(size, dtype=xp.int32)
        self._graphs: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._copied: Any = None  # event after the last host-to-device copy of the inputs
        config = getattr(model, "config", None)
        self.hybrid = bool(config is not None and config.is_hybrid)
        self.replays = 0  # steps replayed (tests and benchmarks read it)
        # speculative mtp: the graphs also put out every row's final hidden state, for the head
        self.keep_hidden = keep_hidden
        self.last_hidden: Any = None  # the last replay's `[T, hidden]`, overwritten by the next
        self._out: Any = None  # (hidden, logits) rows of the largest shape: every graph's outputs, as views

    def capture(self, stream: Any) -> None:
        """Capture every shape, largest first, on `stream` (the decode graphs' capture stream)."""
        import cupy

        cupy.cuda.Device().synchronize()  # see DecodeGraphs.capture: the side stream does not wait
        self._graphs = capture_buckets(
            self.shapes, self._forward, stream, lambda shape: self._stage(shape, [], [], np.zeros(0, np.int32),
                                                                          np.zeros((0, 1), np.int32), stream),
            programmatic=self.backend.kernel_options.pdl,
        )  # fmt: skip
        log.info("captured verify CUDA graphs for (rows, sequences) %s", self.shapes)

    def shape_for(self, counts: Sequence[int]) -> tuple[int, int] | None:
        """The smallest graph whose rows hold chunks of `counts` tokens (each sequence at least one
        padding row short of it: see the module docstring), or None."""
        need = sum(counts)
        return next(((t, n) for t, n in self.shapes if n >= len(counts) and t >= need + n - len(counts) + 1), None)

    def run(
        self, token_ids: np.ndarray, counts: Sequence[int], starts: np.ndarray, tables: np.ndarray,
        state_slots: np.ndarray | None = None, has_initial_state: np.ndarray | None = None,
    ) -> Any:  # fmt: skip
        """Logits `[T, vocab]` of a step of chunks of `counts` tokens after `starts` computed ones (their
        ids packed in `token_ids`, their block tables `tables`); the chunks' rows come first, in order.
        A hybrid model's step also takes each chunk's state row and whether it continues it."""
        if self.hybrid and (state_slots is None or has_initial_state is None):
            raise ValueError("a hybrid model's verify step needs its chunks' state_slots and has_initial_state")
        shape = self.shape_for(counts)
        if shape is None:
            raise ValueError(f"no verify graph holds {len(counts)} chunks of {sum(counts)} tokens")
        graph, output = self._graphs[shape]
        stream = self.backend.xp.cuda.Stream.null  # in order with the eager steps and the sampler
        states = (state_slots, has_initial_state) if self.hybrid else None
        self._stage(shape, token_ids, counts, starts, tables, stream, states)
        graph.launch(stream=stream)
        self.replays += 1
        if not self.keep_hidden:
            return output
        self.last_hidden, logits = output
        return logits

    def _stage(
        self, shape: tuple[int, int], token_ids: Any, counts: Sequence[int], starts: np.ndarray, tables: np.ndarray,
        stream: Any, states: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:  # fmt: skip
        """Fill `shape`'s inputs on the host (the chunks, then the padding sequences) and copy them to the
        device on `stream`."""
        if self._copied is not None:
            self._copied.synchronize()  # the pinned staging area is free once the last copy ran
        t, n = shape
        m, real = len(counts), int(sum(counts))
        ids, pos, slots, qsl, lens, rows, initial, table = self._fields(self._host, shape)
        lengths = np.concatenate([np.asarray(counts, np.int64), np.ones(n - m, np.int64), [t - real - (n - m)]])
        qsl[0] = 0
        qsl[1:] = np.cumsum(lengths)
        firsts = np.concatenate([np.asarray(starts, np.int64), np.zeros(n + 1 - m, np.int64)])
        lens[:] = firsts + lengths
        pos[:] = np.arange(t) - np.repeat(qsl[:-1] - firsts, lengths)  # each sequence's rows from its start
        ids[:real] = token_ids
        ids[real:] = 0
        table[:] = 0  # padding sequences, and entries past a chunk's blocks: the null block 0
        table[:m, : tables.shape[1]] = tables
        bs = self.block_size
        seq_of_row = np.repeat(np.arange(n + 1), lengths)
        slots[:] = table[seq_of_row, pos // bs] * bs + pos % bs
        rows[:] = initial[:] = 0  # padding: zeros in the null state row 0
        if states is not None:
            rows[:m], initial[:m] = states
        size = self._size(shape)
        self._device[:size].set(self._host[:size], stream=stream)
        self._copied = self.backend.xp.cuda.Event(disable_timing=True)
        self._copied.record(stream)

    def _size(self, shape: tuple[int, int]) -> int:
        t, n = shape
        return 3 * t + (n + 2) + 3 * (n + 1) + (n + 1) * self.max_blocks

    def _fields(self, area: Any, shape: tuple[int, int]) -> tuple[Any, ...]:
        """Views of `shape`'s fields in a staging area (host or device): ids, positions, slots,
        query_start_loc, seq_lens, state rows, state starts, block tables."""
        t, n = shape
        sizes = (t, t, t, n + 2, n + 1, n + 1, n + 1)
        ends = [int(end) for end in np.cumsum(sizes)]
        views = [area[end - size : end] for size, end in zip(sizes, ends, strict=True)]
        tables = area[ends[-1] : ends[-1] + (n + 1) * self.max_blocks].reshape(n + 1, self.max_blocks)
        return (*views, tables)

    def _metadata(self, shape: tuple[int, int]) -> AttentionMetadata:
        """The captured forward's metadata: every field a view of the device inputs."""
        _, positions, slots, qsl, seq_lens, state_rows, starts, tables = self._fields(self._device, shape)
        meta = AttentionMetadata(
            query_start_loc=qsl, seq_lens=seq_lens, block_tables=tables, slot_mapping=slots, positions=positions,
            max_query_len=shape[0], max_seq_len=self.max_model_len, block_size=self.block_size,
        )  # fmt: skip
        if self.hybrid:  # the starts as the recurrent kernels read them: a bool per sequence, made in the graph
            meta.state_slots, meta.has_initial_state = state_rows, starts != 0
        return meta

    def _forward(self, shape: tuple[int, int]) -> Any:
        """The step's logits (and hidden states) in the shared output rows (module docstring)."""
        hidden = self.model.forward(self._fields(self._device, shape)[0], self._metadata(shape), self.kv_caches)
        logits = self.model.logits(hidden)
        if self._out is None:  # the first forward: the largest shape's warm-up, before any capture
            self._out = (hidden.copy(), logits.copy())
        rows = shape[0]
        assert self._out[1].shape[0] >= rows, "verify graphs are captured largest first"
        out_hidden, out_logits = self._out[0][:rows], self._out[1][:rows]
        out_logits[...] = logits
        if not self.keep_hidden:
            return out_logits
        out_hidden[...] = hidden
        return out_hidden, out_logits


def capture_verify_graphs(
    model: Any, backend: Backend, kv_caches: list, block_size: int, max_model_len: int, max_batch: int,
    max_drafts: int, stream: Any, keep_hidden: bool = False,
) -> VerifyGraphs | None:  # fmt: skip
    """Captured verify graphs, or None where the GPU has no room for them after the KV cache."""
    graphs = VerifyGraphs(model, backend, kv_caches, block_size, max_model_len, max_batch, max_drafts, keep_hidden)
    return capture_if_room(graphs, stream, "verify steps")

"""CUDA-graph replay of decode steps: one launch per step instead of hundreds.

A decode step (every sequence adds one token) is captured once per batch-size bucket,
reading its inputs from static device buffers. Per step the runner copies the step's
few integers into those buffers (one host-to-device copy) and replays the bucket's graph;
a step launched before the previous one's ids were read back (core/pipeline.py) takes its
token ids from that step's sampled ids on the device instead, copied in on the same stream;
padding rows of a bucket point at the reserved null KV block 0, whose contents nobody
reads. Attention is planned for the longest context the engine allows, so one graph
serves every context length (splits past a sequence's end exit at once).

Each bucket's inputs are laid out field by field ([ids | positions | slots | seq_lens | state rows |
state starts | block tables]), so every field is a contiguous slice that the kernels read in place: no
copy kernels inside the graph. A hybrid model's recurrent layers read each row's state row and whether
it continues it (`AttentionMetadata.state_slots`, `has_initial_state`) from the two state fields;
padding rows start from zeros in the reserved null state row 0, as their KV goes to the null block. Matrix products above the GEMV's token count go through
cuBLAS by ctypes (backend/cuda/blas.py), which capture allows.

Kernels are captured with programmatic dependent launch where the GPU has it (sm_90+,
kernels/runtime/pdl.py): each one starts while its predecessor drains.

Capture runs on a side stream (the legacy default stream cannot capture); replays run on
the default stream, in order with eager prefill steps and the sampler. Captured kernels
write their intermediates into memory-pool blocks of the side stream; CuPy's pool reuses a
stream's freed blocks only for that stream, so eager steps never alias them, and buckets,
captured one after another, share them (they never run at the same time). The static
inputs and the logits outputs are held here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata, Backend, SharedPrefix
from app.engine.kernels.attention_cascade import MIN_SHARED_TOKENS, shared_length
from app.engine.kernels.runtime.pdl import programmatic_launches

log = logging.getLogger(__name__)


# The largest bucket with a short-context graph: above it the batch's (sequence, KV head) pairs alone hold the plain
# plan to a few blocks a pair (attention_decode.plan_blocks: 16 rows of 8 KV heads take 5 either way).
SHORT_BUCKET = 8


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, then of 32: small steps where decode is latency-bound."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + (8 if sizes[-1] < 64 else 32))
    return [s for s in sizes if s < max_batch] + [max_batch]


class DecodeGraphs:
    def __init__(
        self, model: Any, backend: Backend, kv_caches: list, block_size: int, max_model_len: int, max_batch: int
    ):
        xp = backend.xp
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.block_size, self.max_model_len = block_size, max_model_len
        self.buckets = bucket_sizes(max_batch)
        biggest = self.buckets[-1]
        self.max_blocks = -(-max_model_len // block_size)
        # Pinned host staging areas and one device area; bucket n uses their first
        # n * width ints as [ids (n) | positions (n) | slots (n) | seq_lens (n) | state rows (n) |
        # state starts (n: 1 where the row continues its state) | tables (n x max_blocks)].
        # Two host areas taken in turn: with one step in flight, a step's host-to-device copy may
        # not have run yet when the next step stages its inputs. An area is staged again two steps
        # later, after the step that used it was resolved (its sampler event, recorded behind this
        # copy on the same stream, was waited for), so two suffice.
        # After bucket n's fields, two more ints: a cascade step's shared length and its pseudo
        # sequence's length (SharedPrefix).
        self._width = 6 + self.max_blocks
        config = getattr(model, "config", None)
        self.hybrid = bool(config is not None and config.is_hybrid)
        self._hosts = [_pinned_int32(xp, biggest * self._width + 2) for _ in range(2)]
        self._turn = 0
        self._device = xp.zeros(biggest * self._width + 2, dtype=xp.int32)
        self._query_start_loc = xp.arange(biggest + 1, dtype=xp.int32)
        self._graphs: dict[int, tuple[Any, Any]] = {}
        # Buckets of two or more rows get a second graph whose attention reads the blocks all rows
        # share once (kernels/attention_cascade.py), replayed for steps that share enough of them.
        options = getattr(backend, "kernel_options", None)
        self.cascade = bool(options is not None and options.cascade_attention)
        self._cascade_graphs: dict[int, tuple[Any, Any]] = {}
        self.cascade_steps = 0  # steps replayed on a cascade graph (tests and benchmarks read it)
        # Buckets of up to SHORT_BUCKET rows may get a third graph whose attention is planned for contexts of at most
        # `short_context` tokens (KernelOptions.decode_short_context), replayed for steps whose every context fits: the
        # plain graph's plan is for the model's whole context, which at one sequence is 64 blocks a KV head where a
        # few hundred keys need four. Within that bound the plan's max_seq_len is a true bound, as every kernel's
        # split plan needs.
        short = options.decode_short_context if options is not None else 0
        self.short_context = short if 0 < short < max_model_len else 0
        self._short_graphs: dict[int, tuple[Any, Any]] = {}
        self.short_steps = 0  # steps replayed on a short-context graph
        self._pair_starts = {n: xp.asarray([0, n], dtype=xp.int32) for n in self.buckets}
        self.capture_stream: Any = None  # prefill graphs capture on it too, sharing its pool blocks

    def capture(self) -> None:
        """Capture every bucket, largest first (so the pool's blocks fit the smaller ones)."""
        import cupy

        # The side stream does not wait for the default stream, where the weights, the KV cache and
        # the zeroed input buffers were just written: without this sync the warm-up could read
        # stale block tables and slots from reused memory and write out of bounds (seen on the
        # H200 with a second engine in one process, 2026-11-30).
        cupy.cuda.Device().synchronize()
        self.capture_stream = cupy.cuda.Stream(non_blocking=True)
        pdl = self.backend.kernel_options.pdl
        self._graphs = capture_buckets(self.buckets, self._forward, self.capture_stream, programmatic=pdl)
        if self.cascade:
            several = [n for n in self.buckets if n >= 2]
            self._cascade_graphs = capture_buckets(
                several, self._forward_cascade, self.capture_stream, programmatic=pdl
            )
        if self.short_context:
            small = [n for n in self.buckets if n <= SHORT_BUCKET]
            self._short_graphs = capture_buckets(small, self._forward_short, self.capture_stream, programmatic=pdl)
        log.info("captured decode CUDA graphs for batch sizes %s%s%s", self.buckets,
                 " (and their cascade variants)" if self._cascade_graphs else "",
                 f" (and short-context ones to {self.short_context} tokens)" if self._short_graphs else "")  # fmt: skip

    def bucket_for(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def run(
        self,
        token_ids: np.ndarray | None,
        positions: np.ndarray,
        seq_lens: np.ndarray,
        tables: np.ndarray,
        device_ids: Any = None,
        rows: np.ndarray | None = None,
        state_slots: np.ndarray | None = None,
        has_initial_state: np.ndarray | None = None,
    ) -> Any:
        """Logits `[n, vocab]` of one decode step of `n` sequences (host arrays in, device array out).

        The token ids come from the host (`token_ids`) or, with `token_ids` None, from the device:
        row i takes `device_ids[rows[i]]` (`device_ids[i]` when `rows` is None), int32. A hybrid
        model's step also takes each row's state row and whether it continues it.
        """
        if self.hybrid and (state_slots is None or has_initial_state is None):
            raise ValueError("a hybrid model's decode step needs its rows' state_slots and has_initial_state")
        n = len(positions)
        bucket = self.bucket_for(n)
        shared = shared_length(seq_lens, tables, self.block_size) if bucket in self._cascade_graphs else 0
        cascade = shared >= MIN_SHARED_TOKENS
        self.cascade_steps += cascade
        short = not cascade and bucket in self._short_graphs and int(seq_lens.max()) <= self.short_context
        self.short_steps += short
        graph, logits = (self._cascade_graphs if cascade else self._short_graphs if short else self._graphs)[bucket]
        host = self._hosts[self._turn]
        self._turn ^= 1
        ids, pos, slots, lens, state_rows, starts, table = self._fields(host, bucket)
        # Padding rows: token 0 at position 0, one key, written to and read from the null block 0; a
        # recurrent state from zeros in the null state row 0. Table entries past a row's context are
        # never read, so stale ones need no clearing.
        ids[n:] = pos[n:] = slots[n:] = table[n:, 0] = state_rows[n:] = starts[n:] = 0
        lens[n:] = 1
        if self.hybrid:
            state_rows[:n] = state_slots
            starts[:n] = has_initial_state
        ids[:n] = 0 if token_ids is None else token_ids
        pos[:n] = positions
        lens[:n] = seq_lens
        table[:n, : tables.shape[1]] = tables
        bs = self.block_size
        slots[:n] = tables[np.arange(n), positions // bs] * bs + positions % bs
        # Replays go on the default stream, in order with the eager steps and the sampler.
        xp = self.backend.xp
        null = xp.cuda.Stream.null
        size = bucket * self._width
        if cascade:  # padding rows see the shared keys too: harmless, their outputs are dropped
            host[size], host[size + 1] = shared, shared - 1 + bucket
            size += 2
        self._device[:size].set(host[:size], stream=null)
        if token_ids is None:
            # After the staged copy (which wrote zeros there) and before the replay, on its stream;
            # padding rows keep id 0. A plain copy where the rows are in order: a CuPy copy kernel
            # added ~35 us of host time to a step, memcpyAsync ~10 (H200, tiny model, batch 1).
            target = self._device[:n]
            assert device_ids.dtype == xp.int32 and device_ids.flags.c_contiguous
            if rows is None:
                runtime = xp.cuda.runtime
                runtime.memcpyAsync(
                    target.data.ptr, device_ids.data.ptr, 4 * n, runtime.memcpyDeviceToDevice, null.ptr
                )
            else:
                with null:
                    xp.take(device_ids, xp.asarray(rows, dtype=xp.int64), out=target)
        graph.launch(stream=null)
        return logits[:n]

    def _fields(self, area: Any, n: int) -> tuple[Any, ...]:
        """Views of bucket n's fields in a staging area (host or device): ids, positions, slots,
        seq_lens, state rows, state starts, block tables."""
        return (*(area[i * n : (i + 1) * n] for i in range(6)),
                area[6 * n : n * self._width].reshape(n, self.max_blocks))  # fmt: skip

    def _forward_cascade(self, n: int) -> Any:
        return self._forward(n, cascade=True)

    def _forward_short(self, n: int) -> Any:
        return self._forward(n, max_seq_len=self.short_context)

    def _forward(self, n: int, cascade: bool = False, max_seq_len: int | None = None) -> Any:
        token_ids, positions, slots, seq_lens, state_rows, starts, tables = self._fields(self._device, n)
        shared = None
        if cascade:  # the two ints after the bucket's fields; zero at capture: no shared keys
            end = n * self._width
            shared = SharedPrefix(
                self._pair_starts[n], self._device[end + 1 : end + 2], self._device[end : end + 1]
            )
        meta = AttentionMetadata(
            query_start_loc=self._query_start_loc[: n + 1],
            seq_lens=seq_lens,
            block_tables=tables,
            slot_mapping=slots,
            positions=positions,
            max_query_len=1,
            max_seq_len=max_seq_len or self.max_model_len,
            block_size=self.block_size,
            shared_prefix=shared,
        )
        if self.hybrid:  # the starts as the recurrent kernels read them: a bool per row, made in the graph
            meta.state_slots, meta.has_initial_state = state_rows, starts != 0
        hidden = self.model.forward(token_ids, meta, self.kv_caches)
        return self.model.logits(hidden)


def capture_buckets(
    buckets: Sequence[Any],
    forward: Callable[[Any], Any],
    stream: Any,
    stage: Callable[[Any], None] | None = None,
    programmatic: bool = True,
) -> dict[Any, tuple[Any, Any]]:
    """`(graph, output)` of `forward(n)` for every bucket n, captured on `stream` with programmatic
    launches (unless `programmatic` is off), largest first (so the pool's blocks fit the smaller
    ones; a bucket may be a tuple that sorts by its size first). `stage(n)` puts valid inputs in place
    before each warm-up run, which compiles kernels and sizes the pool's blocks."""
    graphs = {}
    with stream, programmatic_launches(programmatic):
        for n in sorted(buckets, reverse=True):
            if stage is not None:
                stage(n)
            forward(n)
            stream.synchronize()
            stream.begin_capture()
            try:
                output = forward(n)
            except BaseException:
                # end the capture so the stream stays usable; the first error is the one to report
                with contextlib.suppress(Exception):
                    stream.end_capture()
                raise
            graph = stream.end_capture()
            graph.upload()
            graphs[n] = (graph, output)
    stream.synchronize()
    return graphs


def capture_if_room(graphs: Any, stream: Any, steps: str) -> Any:
    """`graphs` captured on `stream`, or None where the GPU has no room for their buffers after the KV
    cache (those `steps` then run eagerly, as they do without graphs)."""
    import cupy

    try:
        graphs.capture(stream)
    except cupy.cuda.memory.OutOfMemoryError:
        log.warning("no GPU memory left for %s CUDA graphs after the KV cache: %s run eagerly", steps.split()[0], steps)
        cupy.cuda.Device().synchronize()
        return None
    return graphs


def _pinned_int32(xp: Any, size: int) -> np.ndarray:
    memory = xp.cuda.alloc_pinned_memory(size * 4)
    return np.frombuffer(memory, dtype=np.int32, count=size)

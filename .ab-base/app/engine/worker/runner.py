"""Turns a scheduled batch into device arrays, runs the model, returns the rows to sample.

The runner owns the device side of a step: the flat token batch, positions, the
attention metadata (block tables, slot mapping) and the KV caches of every layer. A decode
step can also take its token ids from the device (`run_from_device`): the previous step's
sampled ids, before the host has read them (core/pipeline.py).

Hybrid models: `kv_caches[i]` is a recurrent layer's tuple of state arrays `[rows, *shape]`
(`allocate_caches`), and each step's metadata says which row each sequence continues
(`state_slots`, from its request) and whether it continues it (`has_initial_state`: its chunk
does not start at token 0; a prefix hit restored the row from a snapshot before the step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backend.base import AttentionMetadata
from app.engine.cache.block_table import block_table_array
from app.engine.models.mrope import mrope_positions
from app.engine.request import PLACEHOLDER, Request
from app.engine.worker.host_states import HostStates


def token_slice(request: Request, start: int, count: int) -> list[int]:
    """Tokens `start:start+count` of prompt + output, without concatenating the two lists."""
    prompt = request.prompt_token_ids
    end = start + count
    if end <= len(prompt):
        return prompt[start:end]
    out_start = max(0, start - len(prompt))
    tokens = prompt[start:] + request.output_token_ids[out_start : end - len(prompt)]
    # a token still on the device must come from there (run_from_device), never from here
    assert PLACEHOLDER not in tokens, f"request {request.request_id!r}: a placeholder reached the host ids"
    return tokens


def chunk_token_ids(chunk: Any) -> list[int]:
    """A chunk's input ids: its tokens of prompt + output, then its drafted tokens (a verify chunk)."""
    drafts = chunk.draft_token_ids
    return token_slice(chunk.request, chunk.start, chunk.num_tokens - len(drafts)) + list(drafts)


def allocate_caches(
    backend: Any, cfg: Any, num_blocks: int, block_size: int, kv_dtype: str, state_rows: int
) -> list[Any]:
    """Each layer's cache: (K, V) paged blocks shaped by its own heads for an attention layer that owns
    one, the pair of the layer it reads for one that shares another's (Gemma 4), zeroed float32 state
    arrays `[state_rows, *shape]` for a recurrent one (models/config.py: state_shapes), None otherwise."""
    caches: list[Any] = []
    for layer in range(cfg.num_layers):
        shapes = cfg.state_shapes(layer)
        xp = backend.xp
        kv_shape = cfg.kv_shape(layer)
        if shapes is not None:
            caches.append(tuple(xp.zeros((state_rows, *shape), xp.float32) for shape in shapes))
        elif kv_shape is not None:
            caches.append(backend.alloc_kv_cache(num_blocks, block_size, *kv_shape, kv_dtype))
        elif layer in cfg.attention_layers:
            caches.append(caches[cfg.kv_source(layer)])
        else:
            caches.append(None)
    return caches


def attention_caches(cfg: Any, kv_caches: list[Any]) -> list[tuple[Any, Any]]:
    """The (K, V) caches the attention layers own (each once: a shared-KV layer reads another's): what
    block copies (offload tiers) move."""
    return [kv_caches[layer] for layer in cfg.attention_layers if cfg.kv_source(layer) == layer]


class ModelRunner:
    def __init__(self, model: Any, backend: Any, kv_caches: list[Any], block_size: int) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.block_size = block_size
        # hybrid models: every recurrent layer's state arrays (one row number names a row in all)
        cfg = getattr(model, "config", None)
        recurrent = [i for i in range(len(kv_caches)) if cfg is not None and cfg.state_shapes(i) is not None]
        self.state_arrays = [array for i in recurrent for array in kv_caches[i]]
        self.host_states: HostStates | None = None  # the host-RAM snapshot tier (allocate_host_states)
        self.graphs: Any = None  # DecodeGraphs, set by the engine on CUDA
        self.prefill_graphs: Any = None  # PrefillGraphs, likewise
        self.verify_graphs: Any = None  # VerifyGraphs, likewise with speculative decoding
        self.images: Any = None  # ImageEmbedder, set by the engine when the model has vision
        self.mrope_merge: int | None = None  # the tower's spatial merge, set for M-RoPE models (Qwen2.5-VL)
        # speculative mtp: every step keeps all its rows' final hidden states for the head (eagerly, or
        # replayed on the verify graphs, which keep them too)
        self.keep_hidden = False
        self.step_hidden: Any = None
        self.split_steps = 0  # steps of decodes and a prompt chunk run as two graph replays (`_mixed_split`)

    def prepare(self, chunks: list[Any]) -> tuple[np.ndarray, AttentionMetadata, np.ndarray]:
        """Host arrays for one step: token ids, attention metadata, and the rows to sample."""
        token_ids: list[int] = []
        for chunk in chunks:
            token_ids.extend(chunk_token_ids(chunk))
        meta, sample_rows = self.metadata(chunks)
        return np.asarray(token_ids, dtype=np.int32), meta, sample_rows

    def metadata(self, chunks: list[Any]) -> tuple[AttentionMetadata, np.ndarray]:
        """Attention metadata of one step (on the device) and the rows to sample; no token ids."""
        bs = self.block_size
        counts = np.array([c.num_tokens for c in chunks], dtype=np.int64)
        starts = np.array([c.start for c in chunks], dtype=np.int64)
        query_start_loc = np.zeros(len(chunks) + 1, dtype=np.int32)
        np.cumsum(counts, out=query_start_loc[1:])
        seq_of_token = np.repeat(np.arange(len(chunks)), counts)
        positions = (
            np.arange(int(counts.sum())) - query_start_loc[seq_of_token] + starts[seq_of_token]
        ).astype(np.int32)
        seq_lens = (starts + counts).astype(np.int32)
        max_blocks = int(-(-seq_lens.max() // bs))
        block_tables = _block_tables(chunks, max_blocks)
        slot_mapping = (block_tables[seq_of_token, positions // bs] * bs + positions % bs).astype(np.int32)
        sample_rows = _sample_rows(chunks, query_start_loc)
        b = self.backend
        meta = AttentionMetadata(
            query_start_loc=b.from_host(query_start_loc),
            seq_lens=b.from_host(seq_lens),
            block_tables=b.from_host(block_tables),
            slot_mapping=b.from_host(slot_mapping),
            positions=b.from_host(positions),
            max_query_len=int(counts.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=bs,
            host_query_start_loc=query_start_loc,
            host_seq_lens=seq_lens,
        )
        if self._needs_step_rope(chunks):
            meta.rope = self.model.mrope_table(self._mrope_positions(chunks))
        if self.state_arrays:
            slots = np.array([c.request.state_slot for c in chunks], dtype=np.int32)
            initial = starts > 0
            meta.host_state_slots, meta.host_has_initial_state = slots, initial
            meta.state_slots, meta.has_initial_state = b.from_host(slots), b.from_host(initial)
        return meta, sample_rows

    def states_before(self, copies: Any) -> None:
        """A step's recurrent-state copies before its forward (cache/state_cache.py: StateCopies):
        host-tier snapshots into their slots, then device snapshots (and rolled-back checkpoints) into
        theirs, then verify chunks' slots into their checkpoint rows, then evicted snapshots out to the
        host tier (worker/host_states.py: on CUDA beside the forward, without waiting for it)."""
        if not copies or not self.state_arrays:
            return
        if copies.loads or copies.spills:
            assert self.host_states is not None, "host-tier copies without host state rows"
            self.host_states.load(copies.loads)
        self.copy_states(copies.restores)
        self.copy_states(copies.checkpoints)
        if copies.spills:
            self.host_states.spill(copies.spills)

    def states_after(self, copies: Any) -> None:
        """A step's recurrent-state copies after its forward: slots into new snapshot rows (after the
        spills of the rows they reuse)."""
        if copies.saves and self.host_states is not None:
            self.host_states.wait_spills()
        self.copy_states(copies.saves)

    def copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """Copy recurrent-state rows (source, destination) in every recurrent layer: a prefix hit's
        snapshot into its slot before a step, a slot into a snapshot row after one. Device ops in
        stream order, no host sync."""
        if not pairs or not self.state_arrays:
            return
        b = self.backend
        src = b.from_host(np.array([p[0] for p in pairs], dtype=np.int64))
        dst = b.from_host(np.array([p[1] for p in pairs], dtype=np.int64))
        for array in self.state_arrays:
            array[dst] = array[src]  # the gather on the right is a copy: overlapping pairs are safe

    def allocate_host_states(self, rows: int) -> None:
        """The host-RAM snapshot tier: `rows` rows of every recurrent layer's state (pinned on CUDA)."""
        self.host_states = HostStates(self.backend, self.state_arrays, rows) if rows else None

    def _needs_step_rope(self, chunks: list[Any]) -> bool:
        """Whether the step rotates by M-RoPE positions (a request with images on an M-RoPE model):
        every later token of such a request is shifted too, so no captured graph (1D positions) runs it."""
        return self.mrope_merge is not None and any(c.request.images for c in chunks)

    def _mrope_positions(self, chunks: list[Any]) -> np.ndarray:
        """`[3, T]` M-RoPE position ids of the step's tokens (equal rows for text-only requests)."""
        merge = self.mrope_merge
        assert merge is not None
        return np.concatenate(
            [mrope_positions(c.request.images, c.start, c.num_tokens, merge) for c in chunks], axis=1
        )

    def run(self, chunks: list[Any]) -> Any:
        """Forward the batch; logits `[n_sampled_rows, vocab]`: a row per sampling chunk, k+1 rows per
        verify chunk of k drafts (a verify graph's replay where one holds the step, else eagerly)."""
        if self.keep_hidden or any(c.draft_token_ids for c in chunks):  # mtp: the verify graphs keep hidden states
            return self._run_verify_graph(chunks) if self._is_verify_graphable(chunks) else self._run_eager(chunks)
        if self.graphs is not None and self._is_graphable(chunks):
            return self._run_graph(chunks)
        if self.images is not None and any(self.images.touches_images(c) for c in chunks):
            return self._run_eager(chunks)
        if self.prefill_graphs is not None and self._is_prefill_graphable(chunks):
            return self._run_prefill_graph(chunks[0])
        prompt = self._mixed_split(chunks)
        if prompt is not None:
            return self._run_mixed(chunks, prompt)
        return self._run_eager(chunks)

    def _run_prefill_graph(self, chunk: Any) -> Any:
        request = chunk.request
        logits = self.prefill_graphs.run(token_slice(request, chunk.start, chunk.num_tokens), chunk.start,
                                         request.block_ids)  # fmt: skip
        return logits if chunk.samples else None

    def split_max_chunk(self) -> int | None:
        """The largest prompt chunk a step of decodes takes as a prefill graph's replay (`_mixed_split`); None
        where such steps are not split."""
        options = getattr(self.backend, "kernel_options", None)
        if self.graphs is None or self.prefill_graphs is None or not getattr(options, "split_mixed_steps", False):
            return None
        return self.prefill_graphs.buckets[-1]

    def _mixed_split(self, chunks: list[Any]) -> int | None:
        """The index of a step's one prompt chunk where the step (decodes beside it) runs as a decode graph's
        replay and a prefill graph's (`split_mixed_steps`): eagerly, a step with any prefill pays hundreds of
        Python launches the graphs don't. None: not such a step, or not asked for."""
        if self.split_max_chunk() is None:
            return None
        prompts = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        if len(prompts) != 1 or len(chunks) < 2:
            return None
        prompt = prompts[0]
        decodes = chunks[:prompt] + chunks[prompt + 1 :]
        if not all(c.samples for c in decodes) or not self._is_graphable(decodes):
            return None
        return prompt if self._is_prefill_graphable([chunks[prompt]]) else None

    def _run_mixed(self, chunks: list[Any], prompt: int) -> Any:
        """`_mixed_split`'s step: the decodes' rows (one each) with the prompt chunk's row, if it samples, at
        its place among them."""
        self.split_steps += 1
        decoded = self._run_graph(chunks[:prompt] + chunks[prompt + 1 :])
        # a copy (on the default stream, before the next replay): the two graphs share memory-pool blocks
        decoded = decoded.copy()
        prefilled = self._run_prefill_graph(chunks[prompt])
        if prefilled is None:
            return decoded
        return self.backend.xp.concatenate([decoded[:prompt], prefilled, decoded[prompt:]])

    def run_from_device(self, chunks: list[Any], device_ids: Any, rows: np.ndarray | None) -> Any:
        """Forward a decode step (each chunk one token that samples) whose token ids are on the
        device: chunk i's is `device_ids[rows[i]]` (`device_ids[i]` when `rows` is None). Logits
        `[n, vocab]`. A CUDA-graph replay where a bucket fits, else the eager path."""
        assert all(c.num_tokens == 1 and c.samples for c in chunks), "run_from_device takes decodes only"
        if self.graphs is not None and self._is_graphable(chunks):
            return self._run_graph(chunks, device_ids, rows)
        meta, sample_rows = self.metadata(chunks)
        b = self.backend
        token_ids = device_ids[: len(chunks)] if rows is None else device_ids[b.from_host(rows)]
        hidden = self.model.forward(token_ids, meta, self.kv_caches)
        return self.model.logits(hidden[b.from_host(sample_rows)])

    def decodes_from_device(self, n: int) -> bool:
        """Whether a look-ahead decode step of `n` sequences should run: with CUDA graphs, only
        when a bucket holds them (a replay launches fast enough to hide behind the step before);
        without graphs (numpy, or CUDA with graphs off) the eager path takes any batch."""
        return self.graphs is None or self.graphs.bucket_for(n) is not None

    def _forward(self, chunks: list[Any]) -> tuple[Any, np.ndarray]:
        """Eager forward of the batch (image soft tokens spliced in); hidden states and sample rows."""
        token_ids, meta, sample_rows = self.prepare(chunks)
        embeds = None
        if self.images is not None:
            inputs = self.images.step_inputs(chunks)
            if inputs is not None:
                embeds, meta.image_spans = inputs
        hidden = self.model.forward(self.backend.from_host(token_ids), meta, self.kv_caches, embeds=embeds)
        self.step_hidden = hidden if self.keep_hidden else None
        return hidden, sample_rows

    def _run_eager(self, chunks: list[Any]) -> Any:
        hidden, sample_rows = self._forward(chunks)
        if len(sample_rows) == 0:
            return None
        return self.model.logits(hidden[self.backend.from_host(sample_rows)])

    def last_hidden(self, chunks: list[Any]) -> Any:
        """Forward the batch; final hidden states (after the last norm) of the sampling chunks' last tokens."""
        hidden, sample_rows = self._forward(chunks)
        return hidden[self.backend.from_host(sample_rows)]

    def _is_prefill_graphable(self, chunks: list[Any]) -> bool:
        """One sequence's chunk of several tokens that a prefill bucket holds."""
        if len(chunks) != 1 or chunks[0].num_tokens < 2 or self._needs_step_rope(chunks):
            return False
        return self.prefill_graphs.bucket_for(chunks[0].num_tokens, chunks[0].start) is not None

    def _is_verify_graphable(self, chunks: list[Any]) -> bool:
        """A step whose chunks a verify graph holds, none with image tokens or M-RoPE positions."""
        if self.verify_graphs is None or self._needs_step_rope(chunks):
            return False
        if self.images is not None and any(self.images.touches_images(c) for c in chunks):
            return False
        return self.verify_graphs.shape_for([c.num_tokens for c in chunks]) is not None

    def _run_verify_graph(self, chunks: list[Any]) -> Any:
        """A step with verify chunks by CUDA-graph replay (worker/verify_graphs.py); the sampled rows."""
        counts = [c.num_tokens for c in chunks]
        starts = np.array([c.start for c in chunks], dtype=np.int32)
        token_ids = np.array([t for c in chunks for t in chunk_token_ids(c)], dtype=np.int32)
        tables = _block_tables(chunks, int(-(-(starts + counts).max() // self.block_size)))
        states = {}
        if self.state_arrays:
            states = {"state_slots": np.array([c.request.state_slot for c in chunks], dtype=np.int32),
                      "has_initial_state": starts > 0}  # fmt: skip
        logits = self.verify_graphs.run(token_ids, counts, starts, tables, **states)
        # a copy: the next replay overwrites the graph's rows, the MTP head may read them later
        self.step_hidden = self.verify_graphs.last_hidden[: len(token_ids)].copy() if self.keep_hidden else None
        sample_rows = _sample_rows(chunks, np.concatenate([[0], np.cumsum(counts)]))
        return logits[self.backend.from_host(sample_rows)] if len(sample_rows) else None

    def _is_graphable(self, chunks: list[Any]) -> bool:
        return (
            all(c.num_tokens == 1 for c in chunks)
            and self.graphs.bucket_for(len(chunks)) is not None
            and not self._needs_step_rope(chunks)
        )

    def _run_graph(self, chunks: list[Any], device_ids: Any = None, rows: np.ndarray | None = None) -> Any:
        """A decode-only step by CUDA-graph replay (every chunk is one token that samples); token
        ids from the requests, or from `device_ids` (see run_from_device)."""
        positions = np.array([c.start for c in chunks], dtype=np.int32)
        token_ids = None
        if device_ids is None:
            token_ids = np.array([token_slice(c.request, c.start, 1)[0] for c in chunks], dtype=np.int32)
        width = int(positions.max()) // self.block_size + 1
        tables = _block_tables(chunks, width)
        states = {}
        if self.state_arrays:  # a hybrid model's rows: their state rows, continued unless at token 0
            states = {"state_slots": np.array([c.request.state_slot for c in chunks], dtype=np.int32),
                      "has_initial_state": positions > 0}  # fmt: skip
        return self.graphs.run(token_ids, positions, positions + 1, tables, device_ids, rows, **states)


def _sample_rows(chunks: list[Any], query_start_loc: np.ndarray) -> np.ndarray:
    """The flat rows that sample: a chunk's last num_sampled_rows tokens (a verify chunk: every drafted
    position and the one after)."""
    return np.array(
        [row for i, c in enumerate(chunks) for row in range(query_start_loc[i + 1] - c.num_sampled_rows,
                                                              query_start_loc[i + 1])],
        dtype=np.int64,
    )  # fmt: skip


def _block_tables(chunks: list[Any], width: int) -> np.ndarray:
    """`[len(chunks), width]` int32: each chunk's block table, cut to `width` or padded with the null
    block 0. Rows are copied from the tables' kept int32 arrays (cache/block_table.py): no per-id
    conversion, which at 32k tokens was most of a step's host time."""
    tables = np.zeros((len(chunks), width), dtype=np.int32)
    for i, chunk in enumerate(chunks):
        table = block_table_array(chunk.request.block_ids)[:width]
        tables[i, : len(table)] = table
    return tables

"""The host side of the decode graphs (worker/decode_graphs.py), without a GPU: which graph a step
replays (the plain one, or the cascade variant when its rows share enough leading blocks) and the
inputs it stages for it, over a stand-in for CuPy whose arrays are numpy arrays."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from app.engine.kernels.attention_cascade import MIN_SHARED_TOKENS
from app.engine.kernels.options import KernelOptions
from app.engine.worker.decode_graphs import SHORT_BUCKET, DecodeGraphs

BLOCK = 16


class _DeviceArray(np.ndarray):
    def set(self, host: np.ndarray, stream: Any = None) -> None:  # cupy's host-to-device copy
        self[...] = host


def _device(a: np.ndarray) -> _DeviceArray:
    return np.asarray(a).view(_DeviceArray)


class _Graph:
    def __init__(self) -> None:
        self.launches = 0

    def launch(self, stream: Any = None) -> None:
        self.launches += 1


def _fake_cupy() -> Any:
    cuda = types.SimpleNamespace(
        alloc_pinned_memory=lambda nbytes: bytearray(nbytes),
        Stream=types.SimpleNamespace(null=None),
    )
    return types.SimpleNamespace(
        int32=np.int32,
        zeros=lambda n, dtype: _device(np.zeros(n, dtype)),
        arange=lambda n, dtype: _device(np.arange(n, dtype=dtype)),
        asarray=lambda a, dtype=None: _device(np.asarray(a, dtype)),
        cuda=cuda,
    )


def _graphs(
    cascade: bool, model: Any = None, short_context: int = 0, max_batch: int = 8
) -> tuple[DecodeGraphs, dict[int, _Graph], dict[int, _Graph]]:
    options = KernelOptions(cascade_attention=cascade, decode_short_context=short_context)
    backend = types.SimpleNamespace(xp=_fake_cupy(), kernel_options=options)
    graphs = DecodeGraphs(model=model, backend=backend, kv_caches=[], block_size=BLOCK, max_model_len=4096,
                          max_batch=max_batch)  # fmt: skip
    plain = {n: _Graph() for n in graphs.buckets}
    several = {n: _Graph() for n in graphs.buckets if n >= 2} if cascade else {}
    graphs._graphs = {n: (g, np.zeros((n, 4))) for n, g in plain.items()}
    graphs._cascade_graphs = {n: (g, np.zeros((n, 4))) for n, g in several.items()}
    return graphs, plain, several


def _step(graphs: DecodeGraphs, tables: np.ndarray, seq_lens: np.ndarray) -> None:
    graphs.run(np.arange(len(seq_lens)), seq_lens - 1, seq_lens, tables)


def _shared_tables(n: int, shared_blocks: int, own_blocks: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    ids = rng.permutation(1000)[: shared_blocks + n * own_blocks] + 1
    shared = ids[:shared_blocks]
    own = ids[shared_blocks:].reshape(n, own_blocks)
    return np.concatenate([np.tile(shared, (n, 1)), own], axis=1).astype(np.int32)


def test_a_batch_over_one_long_prefix_replays_the_cascade_graph_with_its_shared_length() -> None:
    graphs, plain, several = _graphs(cascade=True)
    n, shared_blocks = 3, MIN_SHARED_TOKENS // BLOCK + 4
    tables = _shared_tables(n, shared_blocks, 2)
    seq_lens = np.array([shared_blocks * BLOCK + 5, shared_blocks * BLOCK + 20, shared_blocks * BLOCK + 1], np.int32)
    _step(graphs, tables, seq_lens)
    bucket = graphs.bucket_for(n)
    assert several[bucket].launches == 1 and plain[bucket].launches == 0
    assert graphs.cascade_steps == 1
    end = bucket * graphs._width
    shared = shared_blocks * BLOCK
    assert graphs._device[end] == shared  # SharedPrefix.length
    assert graphs._device[end + 1] == shared - 1 + bucket  # the pseudo sequence's length
    # the step's own fields are staged as for a plain step
    _, _, _, lens, _, _, table = graphs._fields(graphs._device, bucket)
    assert lens[:n].tolist() == seq_lens.tolist() and lens[n:].tolist() == [1] * (bucket - n)
    assert (table[:n, : tables.shape[1]] == tables).all()


def test_short_shares_single_rows_and_the_switch_off_replay_the_plain_graph() -> None:
    graphs, plain, several = _graphs(cascade=True)
    few = MIN_SHARED_TOKENS // BLOCK - 1  # one block short of paying
    _step(graphs, _shared_tables(4, few, 2), np.full(4, few * BLOCK + 3, np.int32))
    _step(graphs, _shared_tables(1, 40, 2), np.array([40 * BLOCK + 3], np.int32))  # nobody to share with
    assert graphs.cascade_steps == 0 and sum(g.launches for g in several.values()) == 0
    assert plain[graphs.bucket_for(4)].launches == 1 and plain[1].launches == 1

    graphs, plain, several = _graphs(cascade=False)
    assert several == {} and not graphs.cascade
    _step(graphs, _shared_tables(4, 60, 2), np.full(4, 60 * BLOCK + 3, np.int32))
    assert graphs.cascade_steps == 0 and plain[graphs.bucket_for(4)].launches == 1


class _HybridModel:
    """A stand-in for a hybrid model: what a captured forward would hand its layers."""

    config = types.SimpleNamespace(is_hybrid=True)

    def __init__(self) -> None:
        self.metas: list[Any] = []

    def forward(self, token_ids: Any, meta: Any, kv_caches: list) -> np.ndarray:
        self.metas.append(meta)
        return np.zeros((len(token_ids), 4))

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        return hidden


def test_a_hybrid_step_stages_its_state_rows_and_starts_where_the_captured_forward_reads_them() -> None:
    """Each row's state row and whether it continues it go into the bucket's two state fields, which the
    captured forward hands the recurrent layers (the starts as bools); padding rows start from zeros in
    the null state row 0. A hybrid step without them is refused."""
    model = _HybridModel()
    graphs, plain, _ = _graphs(cascade=False, model=model)
    seq_lens = np.array([7, 1, 30], np.int32)  # the second row decodes its prompt's only token
    tables = np.array([[3, 0], [5, 0], [8, 9]], np.int32)
    graphs.run(np.arange(3), seq_lens - 1, seq_lens, tables, state_slots=np.array([4, 2, 7]),
               has_initial_state=seq_lens > 1)  # fmt: skip
    bucket = graphs.bucket_for(3)
    assert bucket == 4 and plain[bucket].launches == 1
    _, _, _, _, rows, starts, _ = graphs._fields(graphs._device, bucket)
    assert rows.tolist() == [4, 2, 7, 0] and starts.tolist() == [1, 0, 1, 0]
    graphs._forward(bucket)  # what the capture records reads those fields in place
    meta = model.metas[-1]
    assert meta.state_slots.tolist() == [4, 2, 7, 0]
    assert meta.has_initial_state.dtype == np.bool_ and meta.has_initial_state.tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="state_slots"):
        _step(graphs, tables, seq_lens)


def test_a_model_without_recurrent_layers_leaves_the_state_fields_out_of_its_steps() -> None:
    model = _HybridModel()
    model.config = types.SimpleNamespace(is_hybrid=False)
    graphs, plain, _ = _graphs(cascade=False, model=model)
    _step(graphs, np.array([[3]], np.int32), np.array([5], np.int32))
    graphs._forward(1)
    assert plain[1].launches == 1
    assert model.metas[-1].state_slots is None and model.metas[-1].has_initial_state is None


def _with_short_graphs(graphs: DecodeGraphs) -> dict[int, _Graph]:
    """Stand-ins for the short-context captures, in the buckets DecodeGraphs.capture would give them."""
    short = {n: _Graph() for n in graphs.buckets if n <= SHORT_BUCKET} if graphs.short_context else {}
    graphs._short_graphs = {n: (g, np.zeros((n, 4))) for n, g in short.items()}
    return short


def test_steps_whose_every_context_fits_replay_the_short_context_graph() -> None:
    """PADDOCK_DECODE_SHORT_CONTEXT: a small bucket replays its short-context graph only while every row's
    context is within the bound (its attention plan's max_seq_len); one longer row, a bucket past
    SHORT_BUCKET or a cascade step replays the graph planned for the whole context."""
    graphs, plain, several = _graphs(cascade=True, short_context=1024, max_batch=32)
    short = _with_short_graphs(graphs)
    assert graphs.short_context == 1024 and sorted(short) == [1, 2, 4, 8]
    def tables(n: int, context: int) -> np.ndarray:  # distinct blocks enough for `context` tokens a row
        blocks = -(-context // BLOCK)
        return (np.arange(n * blocks, dtype=np.int32) + 1).reshape(n, blocks)

    _step(graphs, tables(1, 300), np.array([300], np.int32))
    _step(graphs, tables(2, 1024), np.array([1024, 40], np.int32))
    assert short[1].launches == 1 and short[2].launches == 1 and graphs.short_steps == 2
    _step(graphs, tables(2, 1025), np.array([1025, 40], np.int32))
    assert plain[2].launches == 1 and short[2].launches == 1  # one row past the bound
    _step(graphs, tables(16, 40), np.full(16, 40, np.int32))
    assert plain[16].launches == 1 and graphs.short_steps == 2  # no short graph past SHORT_BUCKET
    shared_blocks = MIN_SHARED_TOKENS // BLOCK + 1  # shared keys that pay for a cascade, within the bound
    _step(graphs, _shared_tables(4, shared_blocks, 1), np.full(4, shared_blocks * BLOCK + 5, np.int32))
    assert several[4].launches == 1 and short[4].launches == 0  # a cascade step keeps its graph


def test_the_short_context_graph_plans_for_its_bound_and_the_switch_needs_one_below_the_model_context() -> None:
    model = _HybridModel()
    graphs, _, _ = _graphs(cascade=False, model=model, short_context=256)
    graphs._forward_short(1)
    graphs._forward(1)
    assert [m.max_seq_len for m in model.metas] == [256, 4096]
    for off in (0, 4096, 10_000):
        graphs, _, _ = _graphs(cascade=False, short_context=off)
        assert graphs.short_context == 0 and _with_short_graphs(graphs) == {}

"""prefill_graphs.py's host side without a GPU: which bucket a chunk replays in, and the inputs
it stages (padding after the real tokens, in the request's own block or the null block 0)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from app.engine.worker.prefill_graphs import PrefillGraphs

BLOCK = 16


class _DeviceArray(np.ndarray):
    """A numpy array with CuPy's `set` (a host-to-device copy)."""

    def set(self, host: np.ndarray, stream=None) -> None:
        self[...] = host


class _Event:
    def __init__(self, disable_timing: bool = False) -> None:
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        assert self.recorded


_FAKE_XP = SimpleNamespace(
    int32=np.int32,
    zeros=lambda n, dtype: np.zeros(n, dtype).view(_DeviceArray),
    cuda=SimpleNamespace(alloc_pinned_memory=bytearray, Event=_Event),
)


def _graphs(max_model_len: int = 1024) -> PrefillGraphs:
    return PrefillGraphs(None, SimpleNamespace(xp=_FAKE_XP), [], BLOCK, max_model_len)


def test_bucket_is_the_smallest_that_holds_the_chunk_and_its_padding() -> None:
    graphs = _graphs()
    assert graphs.bucket_for(1, 0) == 16
    assert graphs.bucket_for(17, 0) == 32
    assert graphs.bucket_for(147, 0) == 160
    assert graphs.bucket_for(512, 0) == 512
    assert graphs.bucket_for(513, 0) is None
    assert graphs.bucket_for(100, 1024 - 128) == 128  # the padding still fits the context
    assert graphs.bucket_for(100, 1024 - 127) is None
    assert _graphs(max_model_len=100).buckets == (16, 32, 48, 64, 96)


def test_staged_inputs_pad_after_the_real_tokens() -> None:
    graphs = _graphs()
    graphs._stage([5, 6, 7], 20, [4, 9], 16, None)  # tokens 20..22 of a request holding blocks 4 and 9
    ids, positions, slots, seq_len, qsl, row, table = graphs._fields(graphs._device, 16)
    assert ids.tolist() == [5, 6, 7] + [0] * 13
    assert positions.tolist() == list(range(20, 36))
    # positions 20..31 sit in the request's own block 9; 32..35 lie past its blocks: null block 0
    assert slots.tolist() == [9 * BLOCK + p % BLOCK for p in range(20, 32)] + [
        p % BLOCK for p in range(32, 36)
    ]
    assert seq_len.tolist() == [36]  # the padding's causal context; real tokens see only keys before them
    assert qsl.tolist() == [0, 16]
    assert row.tolist() == [2]  # the last real token's logits are the ones computed
    assert table[:3].tolist() == [4, 9, 0] and not table[2:].any()


def test_staging_a_shorter_chunk_clears_the_longer_ones_leftovers() -> None:
    graphs = _graphs()
    graphs._stage(list(range(1, 17)), 0, [3], 16, None)
    graphs._stage([8], 0, [], 16, None)
    ids, *_, table = graphs._fields(graphs._device, 16)
    assert ids.tolist() == [8] + [0] * 15
    assert not table.any()

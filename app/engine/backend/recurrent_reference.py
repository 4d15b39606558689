"""Recurrent-layer ops written once over an array module (numpy or CuPy): the reference that hybrid
models' layers run on, and the oracle their kernels are tested against.

Each op walks the batch's sequences on the host (`meta.host_query_start_loc`, `host_state_slots`,
`host_has_initial_state`): sequence i's flat rows `qsl[i]:qsl[i+1]` continue the state in row
`state_slots[i]` of the layer's state arrays, or start from zeros where `has_initial_state[i]` is
False (its chunk starts at position 0), and leave the state after their last token in that row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.engine.backend.base import AttentionMetadata


def sequences(meta: AttentionMetadata) -> Iterator[tuple[int, int, int, bool]]:
    """(start row, end row, state slot, continues its state) of each sequence in the batch."""
    qsl, slots, initial = meta.host_query_start_loc, meta.host_state_slots, meta.host_has_initial_state
    assert qsl is not None and slots is not None and initial is not None, (
        "a recurrent step needs host state metadata"
    )
    for i in range(len(slots)):
        yield int(qsl[i]), int(qsl[i + 1]), int(slots[i]), bool(initial[i])


def causal_conv1d(
    xp: Any,
    x: Any,
    weight: Any,
    bias: Any | None,
    conv_state: Any,
    meta: AttentionMetadata,
    silu: bool = True,
) -> Any:
    """Depthwise causal conv over time of `x [T, C]` with `weight [C, K]` (PyTorch's `[C, 1, K]`
    squeezed; tap K-1 multiplies the current input), per sequence, continuing from the K-1 inputs
    before its chunk kept in `conv_state [slots, C, K-1]` (zeros for a sequence that starts here),
    then SiLU when `silu`. Float32 out; the state rows are updated in place."""
    f32 = xp.float32
    x = x.astype(f32, copy=False)
    w = weight.astype(f32, copy=False)
    k = w.shape[1]
    out = xp.empty_like(x)
    for start, end, slot, initial in sequences(meta):
        past = conv_state[slot].T if initial else xp.zeros((k - 1, x.shape[1]), f32)  # [K-1, C]
        xs = xp.concatenate([past.astype(f32, copy=False), x[start:end]], axis=0)  # [K-1+L, C]
        n = end - start
        y = xs[0:n] * w[:, 0]
        for tap in range(1, k):
            y = y + xs[tap : tap + n] * w[:, tap]
        if bias is not None:
            y = y + bias.astype(f32, copy=False)
        out[start:end] = y
        conv_state[slot] = xs[-(k - 1) :].T
    if silu:
        out = out / (f32(1.0) + xp.exp(-out))
    return out

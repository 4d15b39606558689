"""Turning per-token hidden states into one vector per text.

Written against an array module `xp` (numpy or cupy) so the same code runs on either
backend. `hidden` is `[batch, seq, dim]`, `mask` is `[batch, seq]` with 1 for real
tokens and 0 for padding. The modes and their names follow sentence-transformers'
`1_Pooling/config.json`, which is how embedding model folders declare them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Array = Any


def mean_pool(xp: Any, hidden: Array, mask: Array) -> Array:
    weights = mask[:, :, None].astype(hidden.dtype)
    summed = (hidden * weights).sum(axis=1)
    return summed / xp.maximum(weights.sum(axis=1), 1e-9)


def mean_sqrt_len_pool(xp: Any, hidden: Array, mask: Array) -> Array:
    weights = mask[:, :, None].astype(hidden.dtype)
    summed = (hidden * weights).sum(axis=1)
    return summed / xp.sqrt(xp.maximum(weights.sum(axis=1), 1e-9))


def cls_pool(xp: Any, hidden: Array, mask: Array) -> Array:
    return hidden[:, 0]


def max_pool(xp: Any, hidden: Array, mask: Array) -> Array:
    # Padding must never win the max, so it is pushed far below any real activation.
    masked = xp.where(mask[:, :, None] > 0, hidden, xp.asarray(-1e9, dtype=hidden.dtype))
    return masked.max(axis=1)


def last_token_pool(xp: Any, hidden: Array, mask: Array) -> Array:
    """The last real token of each row, for right- or left-padded batches (Qwen3-Embedding's recipe)."""
    last = mask.astype(xp.int64).sum(axis=1) - 1
    if bool((mask[:, -1] > 0).all()):  # left padding (or none): every row ends on a real token
        last = xp.full_like(last, mask.shape[1] - 1)
    return hidden[xp.arange(hidden.shape[0]), last]


POOLERS: dict[str, Callable[[Any, Array, Array], Array]] = {
    "pooling_mode_cls_token": cls_pool,
    "pooling_mode_mean_tokens": mean_pool,
    "pooling_mode_max_tokens": max_pool,
    "pooling_mode_mean_sqrt_len_tokens": mean_sqrt_len_pool,
    "pooling_mode_lasttoken": last_token_pool,
}


@dataclass(frozen=True)
class PoolingConfig:
    """Which poolers run, in sentence-transformers' order; their outputs are concatenated."""

    modes: tuple[str, ...] = ("pooling_mode_mean_tokens",)

    def __post_init__(self) -> None:
        if not self.modes:
            raise ValueError("pooling config enables no pooling mode")
        unknown = [m for m in self.modes if m not in POOLERS]
        if unknown:
            raise ValueError(f"unsupported pooling mode(s) {unknown}; supported: {sorted(POOLERS)}")

    @classmethod
    def from_file(cls, path: Path) -> PoolingConfig:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read pooling config {path}: {error}") from error
        unknown = [k for k, v in data.items() if k.startswith("pooling_mode_") and v and k not in POOLERS]
        if unknown:
            raise ValueError(f"{path}: unsupported pooling mode(s) {unknown}; supported: {sorted(POOLERS)}")
        modes = tuple(k for k in POOLERS if data.get(k))
        if not modes:
            raise ValueError(f"{path} enables no pooling mode")
        return cls(modes)

    def output_dimensions(self, hidden_size: int) -> int:
        return hidden_size * len(self.modes)

    def pool(self, xp: Any, hidden: Array, mask: Array) -> Array:
        pooled = [POOLERS[mode](xp, hidden, mask) for mode in self.modes]
        return pooled[0] if len(pooled) == 1 else xp.concatenate(pooled, axis=1)


def l2_normalize(xp: Any, vectors: Array) -> Array:
    norms = xp.sqrt((vectors * vectors).sum(axis=1, keepdims=True))
    return vectors / xp.maximum(norms, 1e-12)

"""Whole KV blocks packed as bytes, for the offload tiers (cache/offload.py).

A block's payload is the bytes every layer keeps for it, laid end to end in a fixed order:
for each layer, K then V, and for each of those its "leaves" (the plain cache array, or an
FP8 cache's data then its scales). Every leaf has the block id as its leading axis, so one
block of a leaf is `leaf[block_id]`. The same functions serve numpy and CuPy (`xp`): the
backends' `read_kv_blocks` / `write_kv_blocks` are thin wrappers over them.
"""

from __future__ import annotations

from typing import Any

Array = Any


def cache_leaves(kv_caches: list[tuple[Any, Any] | None]) -> list[Array]:
    """Every array that holds per-block KV, in payload order: each cache once (a layer that reads another
    layer's cache lists the same pair again, Gemma 4), layers without a KV cache (None) skipped."""
    leaves: list[Array] = []
    seen: set[int] = set()
    for pair in kv_caches:
        if pair is None or id(pair) in seen:
            continue
        seen.add(id(pair))
        for cache in pair:
            leaves.extend(cache.leaves() if hasattr(cache, "leaves") else (cache,))
    return leaves


def block_nbytes(kv_caches: list[tuple[Any, Any]]) -> int:
    """Bytes of one block's payload."""
    return sum(leaf[0].nbytes for leaf in cache_leaves(kv_caches))


def gather_blocks(xp: Any, kv_caches: list[tuple[Any, Any]], block_ids: Array) -> Array:
    """`[len(block_ids), block_nbytes]` uint8 on the caches' device: the blocks' payloads."""
    n = int(block_ids.shape[0])
    parts = [xp.ascontiguousarray(leaf[block_ids]).view(xp.uint8).reshape(n, -1) for leaf in cache_leaves(kv_caches)]
    return xp.concatenate(parts, axis=1)


def scatter_blocks(xp: Any, kv_caches: list[tuple[Any, Any]], block_ids: Array, payload: Array) -> None:
    """Write `payload [len(block_ids), block_nbytes]` uint8 (on the caches' device) into the blocks."""
    n = int(block_ids.shape[0])
    offset = 0
    for leaf in cache_leaves(kv_caches):
        width = leaf[0].nbytes
        part = xp.ascontiguousarray(payload[:, offset : offset + width])
        leaf[block_ids] = part.view(leaf.dtype).reshape((n, *leaf.shape[1:]))
        offset += width
    if offset != payload.shape[1]:
        raise ValueError(f"a KV block payload of {payload.shape[1]} bytes for caches of {offset} bytes per block")

"""Whole KV blocks packed as bytes, for the offload tiers (cache/offload.py).

A block's payload is the bytes every layer keeps for it, laid end to end in a fixed order:
for each layer, K then V, and for each of those its "leaves" (the plain cache array, or an
FP8 cache's data then its scales). Every leaf has the block id as its leading axis, so one
block of a leaf is `leaf[block_id]`. The same functions serve numpy and CuPy (`xp`): the
backends' `read_kv_blocks` / `write_kv_blocks` are thin wrappers over them (numpy's over the `_rows`
variants, which copy a leaf at a time into or out of separate rows). Each moves any number of
blocks with one indexing per leaf (gather or scatter): a host tier hit of 1,000 blocks is one call, not
1,000 (bench/results/gpu-tiers-s18-2026-12-06.jsonl: per-block calls, 72 launches each, brought back
0.6 GB/s).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
    leaves = cache_leaves(kv_caches)
    out = xp.empty((n, sum(leaf[0].nbytes for leaf in leaves)), xp.uint8)
    offset = 0
    for leaf in leaves:  # a leaf's blocks at a time: no more than one leaf's beside `out`
        part = xp.ascontiguousarray(leaf[block_ids]).view(xp.uint8).reshape(n, -1)
        out[:, offset : offset + part.shape[1]] = part
        offset += part.shape[1]
    return out


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


def gather_into_rows(kv_caches: list[tuple[Any, Any]], block_ids: np.ndarray, rows: list[np.ndarray]) -> None:
    """numpy: the blocks' payloads into separate host rows, one gather per leaf copied into the rows'
    columns (a leaf at a time stays in cache, where gathering every leaf first would not)."""
    offset = 0
    for leaf in cache_leaves(kv_caches):
        taken = leaf[block_ids].view(np.uint8).reshape(len(block_ids), -1)
        for row, part in zip(rows, taken, strict=True):
            row[offset : offset + part.nbytes] = part
        offset += taken.shape[1]


def scatter_from_rows(kv_caches: list[tuple[Any, Any]], block_ids: np.ndarray, rows: list[np.ndarray]) -> None:
    """numpy: separate host rows into the blocks, one scatter per leaf."""
    offset = 0
    for leaf in cache_leaves(kv_caches):
        width = leaf[0].nbytes
        part = np.stack([row[offset : offset + width] for row in rows]) if rows else np.empty((0, width), np.uint8)
        leaf[block_ids] = part.view(leaf.dtype).reshape((len(block_ids), *leaf.shape[1:]))
        offset += width


def host_rows(rows: Any, count: int, nbytes: int) -> list[Any]:
    """`rows` (a `[count, nbytes]` array, or a sequence of `count` rows of `nbytes` uint8 each, anywhere in
    host memory: the host tier's rows live in separate chunks) as a list of 1-D uint8 rows, checked."""
    rows = list(rows)
    if len(rows) != count:
        raise ValueError(f"{len(rows)} host rows for {count} KV blocks")
    for row in rows:
        if row.dtype != "uint8" or row.ndim != 1 or row.nbytes != nbytes or not row.flags.c_contiguous:
            raise ValueError(f"a KV block's host row is {nbytes} contiguous uint8 bytes, got {row.dtype} {row.shape}")
    return rows


def row_runs(rows: list[Any], nbytes: int) -> list[tuple[int, int, int]]:
    """Rows that sit end to end in memory, joined: `(first row, number of rows, address of the first)`
    each, so that one copy moves a run (rows claimed in order from one host chunk usually are one run)."""
    runs: list[tuple[int, int, int]] = []
    for i, row in enumerate(rows):
        address = row.ctypes.data
        if runs and runs[-1][2] + runs[-1][1] * nbytes == address:
            first, count, start = runs[-1]
            runs[-1] = (first, count + 1, start)
        else:
            runs.append((i, 1, address))
    return runs

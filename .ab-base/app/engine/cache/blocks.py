"""Paged KV block allocator: a free list and a reference count per block id.

Integers only: a block id names one fixed-size slot (`block_size` tokens) of the device
KV cache that the backend allocates (`alloc_kv_cache`, one array per layer). Every holder of a block holds one reference: each
request whose block table lists it, and the prefix cache while the block is in its tree.
A block returns to the free list when its last reference is dropped.

Block 0 is reserved as the null block: it is never handed out, so the runner can pad
block tables (and CUDA-graph batches) with 0 and the padding never aliases live KV.
A pool of `num_blocks` therefore has `num_blocks - 1` usable blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from app.engine.cache.block_table import BlockTable

NULL_BLOCK = 0
# Reference changes of at least this many blocks at once (a long prompt's cached prefix on
# admission, its whole table when it finishes) go through numpy; a Python loop over 2,000 ids
# took ~150 us each way (bench/lab/host_cost.py). Fewer ids (a decode's new block) loop.
_VECTOR_MIN = 64


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens."""
    return -(-num_tokens // block_size)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = np.zeros(num_blocks, dtype=np.int64)
        self._last_position = np.empty(num_blocks, dtype=np.int64)  # scratch of _has_duplicates
        # FIFO reuse: a freed block goes to the back, so recently freed KV (which a later
        # host-RAM tier could still want to read) is overwritten last.
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def capacity(self) -> int:
        """Usable blocks (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return int(self._ref_counts[block_id])

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks, each with one reference held by the caller."""
        if not self.can_allocate(n):
            raise ValueError(f"cannot allocate {n} blocks: {len(self._free)} free")
        block_ids = [self._free.popleft() for _ in range(n)]
        if n >= _VECTOR_MIN:
            self._ref_counts[np.fromiter(block_ids, dtype=np.int64, count=n)] = 1
        else:
            for block_id in block_ids:
                self._ref_counts[block_id] = 1
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one reference to blocks that are already in use (shared, not allocated)."""
        ids = _as_ids(block_ids)
        if ids is None:
            for block_id in block_ids:
                if self._ref_counts[block_id] <= 0:
                    raise ValueError(f"incref of block {block_id}, which is free")
                self._ref_counts[block_id] += 1
            return
        free = self._ref_counts[ids] <= 0
        if free.any():
            raise ValueError(f"incref of block {int(ids[np.argmax(free)])}, which is free")
        np.add.at(self._ref_counts, ids, 1)  # add.at: an id listed twice gains two references

    def decref(self, block_ids: Iterable[int]) -> list[int]:
        """Drop one reference from each block; return the blocks that became free."""
        ids = _as_ids(block_ids)
        if ids is None or self._has_duplicates(ids):  # an id listed twice: the loop's order
            return self._decref_each(list(block_ids) if ids is None else ids.tolist())
        counts = self._ref_counts[ids]
        free = counts <= 0
        if free.any():
            raise ValueError(f"decref of block {int(ids[np.argmax(free)])}, which is already free")
        self._ref_counts[ids] = counts - 1
        freed = ids[counts == 1].tolist()
        self._free.extend(freed)
        return freed

    def _has_duplicates(self, ids: np.ndarray) -> bool:
        """Whether an id occurs twice: each id's slot keeps the last position written to it, so an
        earlier occurrence finds another position there (cheaper than np.unique's sort or hash)."""
        positions = np.arange(len(ids))
        self._last_position[ids] = positions
        return bool((self._last_position[ids] != positions).any())

    def _decref_each(self, block_ids: list[int]) -> list[int]:
        freed = []
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise ValueError(f"decref of block {block_id}, which is already free")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free.append(block_id)
                freed.append(block_id)
        return freed

    def check_integrity(self) -> None:
        """Assert: the null block is never in use; every other block is either on the free
        list exactly once with no references, or referenced and not on the free list."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert NULL_BLOCK not in free and self._ref_counts[NULL_BLOCK] == 0, "the null block was handed out"
        on_list = np.zeros(self.num_blocks, dtype=bool)
        on_list[list(free)] = True
        counts = self._ref_counts
        negative = np.flatnonzero(counts < 0)
        assert not len(negative), f"block {int(negative[0])} has a negative reference count"
        wrong = np.flatnonzero((counts[1:] == 0) != on_list[1:]) + 1
        if len(wrong):
            block_id = int(wrong[0])
            where = "on" if on_list[block_id] else "off"
            raise AssertionError(
                f"block {block_id}: ref count {int(counts[block_id])} but {where} the free list"
            )


def _as_ids(block_ids: Iterable[int]) -> np.ndarray | None:
    """The ids as an integer array when there are enough of them to vectorise, else None."""
    if isinstance(block_ids, BlockTable):
        return block_ids.array if len(block_ids) >= _VECTOR_MIN else None
    if isinstance(block_ids, np.ndarray):
        return block_ids if block_ids.dtype.kind in "iu" else None  # np.array([]) is float
    if isinstance(block_ids, list | tuple) and len(block_ids) >= _VECTOR_MIN:
        return np.fromiter(block_ids, dtype=np.int64, count=len(block_ids))
    return None

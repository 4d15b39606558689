"""Paged KV block allocator: a free list and a reference count per block id.

Integers only: a block id names one fixed-size slot (`block_size` tokens) of the device
KV cache that `kv_pool.py` owns. Every holder of a block holds one reference: each
request whose block table lists it, and the prefix cache while the block is in its tree.
A block returns to the free list when its last reference is dropped.

Block 0 is reserved as the null block: it is never handed out, so the runner can pad
block tables (and CUDA-graph batches) with 0 and the padding never aliases live KV.
A pool of `num_blocks` therefore has `num_blocks - 1` usable blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

NULL_BLOCK = 0


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
        self._ref_counts = [0] * num_blocks
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
        return self._ref_counts[block_id]

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks, each with one reference held by the caller."""
        if not self.can_allocate(n):
            raise ValueError(f"cannot allocate {n} blocks: {len(self._free)} free")
        block_ids = [self._free.popleft() for _ in range(n)]
        for block_id in block_ids:
            self._ref_counts[block_id] = 1
        return block_ids

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add one reference to blocks that are already in use (shared, not allocated)."""
        for block_id in block_ids:
            if self._ref_counts[block_id] <= 0:
                raise ValueError(f"incref of block {block_id}, which is free")
            self._ref_counts[block_id] += 1

    def decref(self, block_ids: Iterable[int]) -> list[int]:
        """Drop one reference from each block; return the blocks that became free."""
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
        for block_id in range(1, self.num_blocks):
            count = self._ref_counts[block_id]
            assert count >= 0, f"block {block_id} has a negative reference count"
            assert (count == 0) == (block_id in free), (
                f"block {block_id}: ref count {count} but {'on' if block_id in free else 'off'} the free list"
            )

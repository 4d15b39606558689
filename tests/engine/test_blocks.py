from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cache.block_table import BlockTable
from app.engine.cache.blocks import NULL_BLOCK, BlockPool, blocks_for
from app.engine.cache.manager import KVCacheManager
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams


def test_blocks_for_rounds_up() -> None:
    assert [blocks_for(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_null_block_is_never_handed_out() -> None:
    pool = BlockPool(5, 16)
    assert pool.capacity == pool.num_free == 4
    assert sorted(pool.allocate(4)) == [1, 2, 3, 4]
    assert NULL_BLOCK == 0 and not pool.can_allocate(1)
    pool.check_integrity()


def test_allocate_refuses_more_than_free() -> None:
    pool = BlockPool(4, 8)
    pool.allocate(2)
    assert pool.can_allocate(1) and not pool.can_allocate(2)
    with pytest.raises(ValueError, match="cannot allocate 2 blocks: 1 free"):
        pool.allocate(2)


def test_shared_block_is_freed_by_its_last_holder() -> None:
    pool = BlockPool(4, 8)
    [block] = pool.allocate(1)
    pool.incref([block])
    assert pool.ref_count(block) == 2
    assert pool.decref([block]) == []
    assert pool.num_free == 2
    assert pool.decref([block]) == [block]
    assert pool.num_free == 3 and pool.ref_count(block) == 0
    pool.check_integrity()


def test_misuse_is_named() -> None:
    pool = BlockPool(4, 8)
    with pytest.raises(ValueError, match="decref of block 2, which is already free"):
        pool.decref([2])
    with pytest.raises(ValueError, match="incref of block 3, which is free"):
        pool.incref([3])
    with pytest.raises(ValueError, match="num_blocks must be at least 2"):
        BlockPool(1, 8)


def test_freed_blocks_are_reused_last() -> None:
    pool = BlockPool(5, 8)
    first = pool.allocate(2)
    pool.decref(first)
    assert pool.allocate(2) == [3, 4]  # the never-used blocks before the just-freed ones


def test_random_operations_keep_integrity() -> None:
    rng = random.Random(7)
    pool = BlockPool(33, 4)
    held: list[int] = []  # one entry per reference we hold
    for _ in range(2000):
        action = rng.random()
        if action < 0.4 and pool.num_free:
            held += pool.allocate(rng.randint(1, pool.num_free))
        elif action < 0.6 and held:
            block = rng.choice(held)
            pool.incref([block])
            held.append(block)
        elif held:
            drop = rng.sample(range(len(held)), rng.randint(1, len(held)))
            blocks = [held[i] for i in drop]
            for i in sorted(drop, reverse=True):
                del held[i]
            pool.decref(blocks)
        pool.check_integrity()
        assert pool.num_free == pool.capacity - len(set(held))
        assert all(pool.ref_count(b) == held.count(b) for b in set(held))


class LoopPool:
    """The pool's reference counting written as plain per-id loops: the oracle that BlockPool's
    numpy path (many ids at once) must agree with, duplicates and errors included."""

    def __init__(self, num_blocks: int) -> None:
        self.counts = [0] * num_blocks
        self.free = deque(range(1, num_blocks))

    def allocate(self, n: int) -> list[int]:
        taken = [self.free.popleft() for _ in range(n)]
        for block_id in taken:
            self.counts[block_id] = 1
        return taken

    def incref(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if self.counts[block_id] <= 0:
                raise ValueError(f"incref of block {block_id}, which is free")
        for block_id in block_ids:
            self.counts[block_id] += 1

    def decref(self, block_ids: list[int]) -> list[int]:
        freed = []
        for block_id in block_ids:
            if self.counts[block_id] <= 0:
                raise ValueError(f"decref of block {block_id}, which is already free")
            self.counts[block_id] -= 1
            if self.counts[block_id] == 0:
                self.free.append(block_id)
                freed.append(block_id)
        return freed


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_vectorised_reference_counts_match_the_loop(data: st.DataObject) -> None:
    """Batches above the vectorising threshold (64 ids), given as lists, tuples, numpy arrays or
    BlockTables, with ids listed twice and ids already free: same counts, same free-list order,
    same blocks reported freed, the same error for the same first bad id."""
    pool, oracle = BlockPool(300, 4), LoopPool(300)
    for _ in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["allocate", "incref", "decref"]))
        if action == "allocate":
            n = data.draw(st.integers(0, pool.num_free))
            assert pool.allocate(n) == oracle.allocate(n)
            continue
        ids = data.draw(st.lists(st.integers(1, 299), min_size=0, max_size=150))
        if data.draw(st.booleans()):  # mostly blocks in use, as real callers pass
            in_use = [b for b in range(1, 300) if oracle.counts[b] > 0]
            if in_use:
                ids = data.draw(st.lists(st.sampled_from(in_use), min_size=60, max_size=150))
        kind = data.draw(st.sampled_from(["list", "tuple", "array", "table"]))
        given_ids = {"list": list, "tuple": tuple, "array": np.array, "table": BlockTable}[kind](ids)
        try:
            expected = getattr(oracle, action)(list(ids))
        except ValueError as error:
            with pytest.raises(ValueError, match=str(error)):
                getattr(pool, action)(given_ids)
            return  # the loop stops part-way; the pool checks first and changes nothing
        assert getattr(pool, action)(given_ids) == expected
        assert [pool.ref_count(b) for b in range(300)] == oracle.counts
        assert list(pool._free) == list(oracle.free)
        pool.check_integrity()


# --- KVCacheManager: the pool and the prefix cache together ---


def request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), SamplingParams())


def run_prefill(kv: KVCacheManager, req: Request) -> None:
    """What the scheduler and engine do for a whole prompt: match, allocate, compute."""
    kv.match_prefix(req)
    assert kv.allocate(req, req.num_pending_tokens)
    req.num_computed_tokens = req.num_tokens


def test_manager_reuses_full_blocks_but_never_the_last_tokens_block() -> None:
    kv = KVCacheManager(16, 4)
    first = request("a", range(8))
    run_prefill(kv, first)
    kv.free(first)
    assert kv.num_cached_blocks == 2 and kv.num_used_blocks == 0
    again = request("b", range(8))  # same 8 tokens: the block holding token 7 is recomputed
    assert kv.match_prefix(again) == 4
    assert again.num_computed_tokens == again.num_cached_tokens == 4
    longer = request("c", range(13))
    assert kv.match_prefix(longer) == 8 and longer.block_ids[:1] == again.block_ids
    kv.check_integrity()
    assert kv.pool.ref_count(longer.block_ids[0]) == 3  # two requests and the cache


def test_manager_caches_only_computed_full_blocks() -> None:
    kv = KVCacheManager(16, 4)
    req = request("a", range(10))
    kv.match_prefix(req)
    assert kv.allocate(req, 10) and len(req.block_ids) == 3
    req.num_computed_tokens = 6  # a chunk of 6 ran, then the request ended
    kv.free(req)
    assert kv.num_cached_blocks == 1 and req.block_ids == []
    assert kv.pool.num_free == kv.capacity - 1
    kv.check_integrity()


def test_manager_frees_duplicates_of_cached_blocks() -> None:
    kv = KVCacheManager(16, 4)
    a, b = request("a", range(9)), request("b", range(9))
    run_prefill(kv, a)
    run_prefill(kv, b)  # admitted before a finished: no hit, its own copies
    assert set(a.block_ids).isdisjoint(b.block_ids)
    kv.free(a)
    kv.free(b)
    assert kv.num_cached_blocks == 2 and kv.pool.num_free == kv.capacity - 2
    kv.check_integrity()


def test_manager_evicts_cached_blocks_when_short_and_refuses_beyond() -> None:
    kv = KVCacheManager(5, 4)  # 4 usable blocks
    old = request("old", range(100, 112))
    run_prefill(kv, old)
    kv.free(old)
    assert kv.pool.num_free == 1 and kv.num_free_blocks == 4
    new = request("new", range(16))
    kv.match_prefix(new)
    assert new.num_computed_tokens == 0
    assert not kv.can_allocate(new, 17)
    assert not kv.allocate(new, 17) and new.block_ids == []
    assert kv.allocate(new, 16) and kv.num_cached_blocks == 0
    assert kv.usage() == 1.0
    kv.check_integrity()


def test_manager_keeps_first_cached_figure_after_preemption() -> None:
    kv = KVCacheManager(16, 4)
    run_prefill(kv, warm := request("w", range(9)))
    kv.free(warm)
    req = request("r", range(9))
    kv.match_prefix(req)
    assert req.num_cached_tokens == 8
    kv.free(req)
    req.num_computed_tokens = 0
    req.status = RequestStatus.PREEMPTED
    kv.reset_prefix_cache()
    assert kv.match_prefix(req) == 0 and req.num_cached_tokens == 8
    assert kv.allocate(req, 9)
    with pytest.raises(ValueError, match="already holds KV"):
        kv.match_prefix(req)
    kv.check_integrity()


def test_manager_without_prefix_caching() -> None:
    kv = KVCacheManager(8, 4, enable_prefix_caching=False)
    req = request("a", range(9))
    run_prefill(kv, req)
    kv.free(req)
    assert kv.num_cached_blocks == 0 and kv.pool.num_free == kv.capacity
    assert kv.match_prefix(request("b", range(9))) == 0
    kv.check_integrity()

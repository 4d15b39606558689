from __future__ import annotations

import random

import pytest

from app.engine.cache.radix import EvictedBlocks, RadixCache

BS = 4


def toks(*blocks: int) -> list[int]:
    """Token ids made of whole blocks: block value v becomes [v, v, v, v]."""
    return [v for v in blocks for _ in range(BS)]


def test_miss_on_empty_cache() -> None:
    cache = RadixCache(BS)
    result = cache.match(toks(1, 2))
    assert result.block_ids == [] and result.num_tokens == 0
    cache.check_integrity()


def test_insert_then_match_whole_and_partial() -> None:
    cache = RadixCache(BS)
    inserted = cache.insert(toks(1, 2, 3), [10, 11, 12])
    assert inserted.num_cached_tokens == 0
    assert cache.match(toks(1, 2, 3))[:2] == ([10, 11, 12], 12)
    assert cache.match(toks(1, 2, 9))[:2] == ([10, 11], 8)
    # tokens past the last full block are ignored: only full blocks are cached
    assert cache.match([*toks(1, 2, 3), 1, 1])[:2] == ([10, 11, 12], 12)
    assert cache.match([1, 1, 1])[:2] == ([], 0)
    cache.check_integrity()


def test_match_splits_a_partly_matched_node() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1, 2, 3), [10, 11, 12])
    result = cache.match(toks(1, 2))
    assert result.node.block_ids == [10, 11] and result.node.parent.is_root
    assert result.node.children[tuple(toks(3))].block_ids == [12]
    cache.check_integrity()


def test_insert_shares_the_existing_prefix() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1, 2, 3), [10, 11, 12])
    inserted = cache.insert(toks(1, 2, 7, 8), [20, 21, 22, 23])
    assert inserted.num_cached_tokens == 8  # the caller's blocks 20, 21 were not taken
    assert cache.match(toks(1, 2, 7, 8))[:2] == ([10, 11, 22, 23], 16)
    assert cache.match(toks(1, 2, 3))[:2] == ([10, 11, 12], 12)
    assert sorted(cache.iter_block_ids()) == [10, 11, 12, 22, 23]
    assert cache.insert(toks(1, 2), [30, 31]).num_cached_tokens == 8
    assert cache.num_blocks == 5
    cache.check_integrity()


def test_insert_checks_lengths() -> None:
    with pytest.raises(ValueError, match="insert needs 8 tokens for 2 blocks, got 7"):
        RadixCache(BS).insert([1] * 7, [1, 2])


def test_extra_key_namespaces_do_not_mix() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1, 2), [10, 11], extra_key="model-a")
    cache.insert(toks(1, 2), [20, 21], extra_key="model-b")
    assert cache.match(toks(1, 2), extra_key="model-a").block_ids == [10, 11]
    assert cache.match(toks(1, 2), extra_key="model-b").block_ids == [20, 21]
    assert cache.match(toks(1, 2)).block_ids == []
    cache.check_integrity()


def test_lock_moves_blocks_between_counters() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1, 2, 3), [10, 11, 12])
    assert (cache.evictable_blocks, cache.protected_blocks) == (3, 0)
    node = cache.match(toks(1, 2)).node
    cache.lock(node)
    cache.lock(node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (1, 2)
    cache.check_integrity()
    with pytest.raises(ValueError, match="cannot evict 2 blocks: only 1 are evictable"):
        cache.evict(2)
    assert cache.evict(1) == [12]
    cache.unlock(node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (0, 2)
    cache.unlock(node)
    assert (cache.evictable_blocks, cache.protected_blocks) == (2, 0)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    cache.check_integrity()


def test_lock_survives_a_later_split() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1, 2, 3), [10, 11, 12])
    node = cache.match(toks(1, 2, 3)).node
    cache.lock(node)
    cache.match(toks(1, 5))  # splits the locked node after its first block
    cache.check_integrity()
    assert cache.protected_blocks == 3
    cache.unlock(node)
    assert cache.evictable_blocks == 3
    cache.check_integrity()


def test_evicts_least_recently_used_leaf_first() -> None:
    cache = RadixCache(BS)
    cache.insert(toks(1), [10])
    cache.insert(toks(2), [20])
    cache.insert(toks(3), [30])
    cache.match(toks(1))  # 1 is now the freshest; 2 the stalest
    assert cache.evict(1) == [20]
    assert cache.evict(1) == [30]
    assert cache.evict(1) == [10]
    assert cache.num_blocks == 0
    cache.check_integrity()


def test_eviction_trims_leaf_tails_then_parents() -> None:
    evicted: list[EvictedBlocks] = []
    cache = RadixCache(BS, on_evict=evicted.append)
    cache.insert(toks(1, 2, 3), [10, 11, 12])
    assert cache.evict(1) == [12]
    assert cache.match(toks(1, 2, 3))[:2] == ([10, 11], 8)
    cache.insert(toks(1, 5), [40, 41])  # 1 -> {2, 5}
    assert cache.evict(2) == [11, 41]  # the two leaves go before their shared parent
    assert cache.evict(1) == [10]
    assert evicted[0] == EvictedBlocks(None, tuple(toks(1, 2, 3)), [12])
    assert [e.token_ids for e in evicted[1:]] == [tuple(toks(1, 2)), tuple(toks(1, 5)), tuple(toks(1))]
    cache.check_integrity()


def test_hook_sees_the_namespace() -> None:
    evicted: list[EvictedBlocks] = []
    cache = RadixCache(BS, on_evict=evicted.append)
    cache.insert(toks(4), [7], extra_key=("gemma", "lora-1"))
    cache.evict(1)
    assert evicted == [EvictedBlocks(("gemma", "lora-1"), tuple(toks(4)), [7])]


class ModelCache:
    """An independent reference: a flat dict from each cached full-block prefix to its block,
    with the last access and the lock count of every prefix; evicts one block at a time."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[int, ...], int] = {}
        self.access: dict[tuple[int, ...], int] = {}
        self.locks: dict[tuple[int, ...], int] = {}
        self.clock = 0

    def prefixes(self, tokens: list[int]) -> list[tuple[int, ...]]:
        return [tuple(tokens[:end]) for end in range(BS, len(tokens) // BS * BS + 1, BS)]

    def match(self, tokens: list[int]) -> list[tuple[int, ...]]:
        self.clock += 1
        found = []
        for key in self.prefixes(tokens):
            if key not in self.blocks:
                break
            self.access[key] = self.clock
            found.append(key)
        return found

    def insert(self, tokens: list[int], block_ids: list[int]) -> list[int]:
        self.clock += 1
        taken = []
        for key, block in zip(self.prefixes(tokens), block_ids, strict=True):
            if key not in self.blocks:
                self.blocks[key] = block
                self.locks[key] = 0
                taken.append(block)
            self.access[key] = self.clock
        return taken

    def evict(self, n: int) -> set[int]:
        evicted = set()
        for _ in range(n):
            leaves = [k for k in self.blocks if self.locks[k] == 0 and not self.extended(k)]
            key = min(leaves, key=lambda k: self.access[k])
            evicted.add(self.blocks.pop(key))
        return evicted

    def extended(self, key: tuple[int, ...]) -> bool:
        return any(len(k) == len(key) + BS and k[: len(key)] == key for k in self.blocks)


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_a_flat_reference(seed: int) -> None:
    rng = random.Random(seed)
    cache, model = RadixCache(BS), ModelCache()
    next_block = 1
    locks = []  # (tree handle, the prefixes it locks in the model)
    for _ in range(1200):
        tokens = toks(*[rng.randint(0, 2) for _ in range(rng.randint(1, 6))])
        action = rng.random()
        if action < 0.4:
            block_ids = list(range(next_block, next_block + len(tokens) // BS))
            next_block += len(block_ids)
            result = cache.insert(tokens, block_ids)
            assert block_ids[result.num_cached_tokens // BS :] == model.insert(tokens, block_ids)
        elif action < 0.7:
            result = cache.match(tokens)
            keys = model.match(tokens)
            assert result.block_ids == [model.blocks[k] for k in keys]
            assert result.num_tokens == len(keys) * BS
            if keys and rng.random() < 0.5:
                cache.lock(result.node)
                for key in keys:
                    model.locks[key] += 1
                locks.append((result.node, keys))
        elif action < 0.8 and locks:
            node, keys = locks.pop(rng.randrange(len(locks)))
            cache.unlock(node)
            for key in keys:
                model.locks[key] -= 1
        elif cache.evictable_blocks:
            n = rng.randint(1, min(3, cache.evictable_blocks))
            assert set(cache.evict(n)) == model.evict(n)  # the same blocks, least recently used first
        cache.check_integrity()
        assert sorted(cache.iter_block_ids()) == sorted(model.blocks.values())
        assert cache.evictable_blocks == sum(1 for k in model.blocks if model.locks[k] == 0)

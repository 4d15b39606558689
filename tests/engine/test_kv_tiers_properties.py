"""Block pool + radix tree + host and disk tiers together, under random operations (hypothesis).

The "device" is the numpy backend's KV cache at a tiny shape; what a request "computes" into a
block is a pattern derived from the token prefix that ends with it, so wherever a block comes
from (the tree, the host tier, a disk file) its contents can be checked against what they must
be, and a disk file with a flipped bit must never be loaded. Each step checks every invariant: no block leaked or held twice, no negative reference
count, tier rows and files accounted for.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.engine.backend.cpu import CpuBackend
from app.engine.cache.disk_tier import DiskTier
from app.engine.cache.manager import KVCacheManager
from app.engine.cache.offload import DeviceBlocks, HostTier, KVTiers
from app.engine.request import Request, RequestStatus
from app.engine.sampling_params import SamplingParams

BS, LAYERS, HEADS, DIM = 4, 2, 1, 3
NUM_BLOCKS = 12


def expected_block(tokens: list[int], end: int, shape: tuple[int, ...]) -> np.ndarray:
    """What a block ending at token `end` holds: a pattern from its whole prefix."""
    seed = int.from_bytes(hashlib.blake2b(np.asarray(tokens[:end], np.int64).tobytes(), digest_size=8).digest())
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class TieredCache(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.backend = CpuBackend()
        self.kv_caches = [self.backend.alloc_kv_cache(NUM_BLOCKS, BS, HEADS, DIM) for _ in range(LAYERS)]
        copier = DeviceBlocks(self.backend, self.kv_caches)
        host = HostTier(5, copier)
        disk = DiskTier(self.tmp.name, 9 * (copier.block_nbytes + 100), b"\x01" * 32, copier.block_nbytes)
        self.tiers = KVTiers(copier, BS, host, disk)
        self.kv = KVCacheManager(NUM_BLOCKS, BS, tiers=self.tiers)
        self.running: list[Request] = []
        self.ids = itertools.count()

    def teardown(self) -> None:
        self.tmp.cleanup()

    def _check_contents(self, request: Request, num_blocks: int) -> None:
        tokens = request.all_token_ids
        for i, block_id in enumerate(request.block_ids[:num_blocks]):
            for k_cache, v_cache in self.kv_caches:
                want = expected_block(tokens, (i + 1) * BS, k_cache[block_id].shape)
                np.testing.assert_array_equal(k_cache[block_id], want)
                np.testing.assert_array_equal(v_cache[block_id], -want)

    @precondition(lambda self: len(self.running) < 3)
    @rule(
        prefix=st.sampled_from([(), (1, 1, 1, 1, 2, 2, 2, 2), (1, 1, 1, 1, 3, 3, 3, 3), (5, 5, 5, 5)]),
        tail=st.lists(st.integers(1, 3), min_size=1, max_size=14),
    )
    def admit(self, prefix: tuple[int, ...], tail: list[int]) -> None:
        """Match (tree, then tiers), check the reused blocks' contents, then compute the rest."""
        request = Request(f"r{next(self.ids)}", [*prefix, *tail], SamplingParams(max_tokens=1))
        matched = self.kv.match_prefix(request)
        assert matched % BS == 0 and matched <= request.num_tokens - 1
        assert sum(request.cached_tokens_by_tier.values()) == matched
        self._check_contents(request, matched // BS)
        if not self.kv.allocate(request, request.num_tokens - matched):
            self.kv.free(request)
            return
        for i in range(matched // BS, request.num_tokens // BS):  # the "forward pass" of full blocks
            block_id = request.block_ids[i]
            for k_cache, v_cache in self.kv_caches:
                k_cache[block_id] = expected_block(request.all_token_ids, (i + 1) * BS, k_cache[block_id].shape)
                v_cache[block_id] = -k_cache[block_id]
        request.num_computed_tokens = request.num_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 2))
    def release(self, index: int) -> None:
        request = self.running.pop(index % len(self.running))
        self._check_contents(request, request.num_computed_tokens // BS)
        self.kv.free(request)

    @rule()
    def evict_all(self) -> None:
        """Everything unused goes down a tier (host, and from there to disk)."""
        self.kv.reset_prefix_cache()

    @rule()
    def flush_host(self) -> None:
        self.tiers.flush_host_to_disk()

    @rule(pick=st.integers(0, 100), offset=st.integers(0, 10_000))
    def corrupt_a_file(self, pick: int, offset: int) -> None:
        """Flip a bit of some stored block: it must never be loaded (admit checks every reused block)."""
        assert self.tiers.disk is not None
        files = sorted(self.tiers.disk.folder.glob("*.kvb"))
        if files:
            path = files[pick % len(files)]
            raw = bytearray(path.read_bytes())
            raw[offset % len(raw)] ^= 0x10
            path.write_bytes(bytes(raw))

    @rule()
    def drain(self) -> None:
        """Nothing leaks: with every request released and the tree emptied, every block is free."""
        while self.running:
            self.release(0)
        self.kv.reset_prefix_cache()
        assert self.kv.pool.num_free == self.kv.capacity

    @invariant()
    def consistent(self) -> None:
        self.kv.check_integrity()  # reference counts == holders, none negative, tree and host rows sound
        assert self.tiers.disk is not None
        self.tiers.disk.check_integrity()


TieredCache.TestCase.settings = settings(max_examples=40, stateful_step_count=60, deadline=None)  # 2,400 operations
test_tiered_cache = TieredCache.TestCase

"""KV cache manager: ties the block pool to the radix prefix cache, per request.

Reference rule: a request holds one pool reference on every block of its block table
(shared prefix blocks included); the prefix cache holds one on every block in its tree.
Shared blocks are read-only: matching never covers the block that holds a request's
last known token, so the tokens a step writes always land in blocks private to it.

"Free" blocks, as the scheduler sees them, are the pool's free list plus the cached
blocks no running request uses (evicted on demand, least recently used first).

Hybrid models (recurrent layers) add a state cache (cache/state_cache.py): each running request
holds a state slot, and a prefix match only counts up to where a snapshot of the recurrent state
exists, since the recurrent layers cannot resume anywhere else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

from app.engine.cache.block_table import BlockTable
from app.engine.cache.blocks import NULL_BLOCK, BlockPool, blocks_for
from app.engine.cache.offload import KVTiers
from app.engine.cache.radix import EvictedBlocks, MatchResult, RadixCache, RadixNode
from app.engine.cache.state_cache import StateCache
from app.engine.request import Request, RequestStatus


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        extra_key: Hashable = None,
        on_evict: Callable[[EvictedBlocks], None] | None = None,
        tiers: KVTiers | None = None,
        state: StateCache | None = None,
    ) -> None:
        if state is not None and tiers is not None:
            raise ValueError(
                "the host/disk KV tiers do not hold recurrent state snapshots: hybrid models run without them"
            )
        self.block_size = block_size
        self.state = state  # hybrid models: state slots and snapshots
        self.pool = BlockPool(num_blocks, block_size)
        # no prefix cache, no tiers: with prefix caching off nothing is reused at all
        self.tiers = tiers if enable_prefix_caching else None
        if self.tiers is not None:
            on_evict = _both(on_evict, self.tiers.spill)
        self.prefix_cache = RadixCache(block_size, on_evict) if enable_prefix_caching else None
        self.evicted_blocks = 0  # cached blocks evicted from the device pool, since start
        self.extra_key = extra_key  # the prefix-cache namespace: one per model/adapter
        self._holders: dict[str, Request] = {}  # requests holding blocks or a cache lock
        self._locks: dict[str, RadixNode] = {}  # request id -> its locked prefix-cache match

    @property
    def capacity(self) -> int:
        """Usable blocks in all (the reserved null block excluded)."""
        return self.pool.capacity

    @property
    def num_cached_blocks(self) -> int:
        return self.prefix_cache.num_blocks if self.prefix_cache else 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can get now: free ones plus cached ones no request uses."""
        evictable = self.prefix_cache.evictable_blocks if self.prefix_cache else 0
        return self.pool.num_free + evictable

    @property
    def num_used_blocks(self) -> int:
        return self.capacity - self.num_free_blocks

    def usage(self) -> float:
        """Fraction of the usable blocks that running requests hold (0.0 .. 1.0)."""
        return self.num_used_blocks / self.capacity

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def can_admit(self) -> bool:
        """Whether a new request can get what every running one holds besides blocks (a state slot)."""
        return self.state is None or self.state.can_admit()

    def match_prefix(self, request: Request) -> int:
        """Reuse cached full blocks of the request's tokens; return how many tokens they cover.

        Sets `block_ids` and `num_computed_tokens` (and, on first admission,
        `num_cached_tokens`). At most `(num_tokens - 1) // block_size` blocks are matched,
        so the last token, whose logits the step needs, is always computed. A hybrid model's
        request gets its state slot here, restored from the snapshot the match ends at.
        """
        if request.block_ids or request.num_computed_tokens:
            raise ValueError(f"request {request.request_id} already holds KV; match_prefix is for admission")
        matched = 0
        tiers: dict[str, int] = {}
        if self.state is not None:
            self.state.slot(request)
        if self.prefix_cache is not None and request.num_tokens > 0:
            max_tokens = (request.num_tokens - 1) // self.block_size * self.block_size
            tokens = request.cache_token_prefix(max_tokens)
            result = self.prefix_cache.match(tokens, self.extra_key)
            if self.state is not None:
                result = self._resumable(request, tokens, result)
            if result.num_tokens:
                self.prefix_cache.lock(result.node)
                self._locks[request.request_id] = result.node
                request.block_ids = BlockTable(result.block_ids)
                self.pool.incref(request.block_ids)  # through the table's int32 copy
                request.num_computed_tokens = matched = result.num_tokens
                self._holders[request.request_id] = request
                tiers["device"] = matched
            if self.tiers is not None:
                matched += self._load_from_tiers(request, tokens, tiers)
        if request.status == RequestStatus.WAITING:  # a recompute after preemption keeps the first figure
            request.num_cached_tokens = min(matched, request.num_prompt_tokens)
            request.cached_tokens_by_tier = tiers
        return matched

    def _resumable(self, request: Request, tokens: list[int], result: MatchResult) -> MatchResult:
        """The KV match cut back to the longest prefix whose recurrent state snapshot exists."""
        assert self.state is not None and self.prefix_cache is not None
        blocks = self.state.resume(request, tokens, result.num_tokens // self.block_size)
        if blocks * self.block_size == result.num_tokens:
            return result
        return self.prefix_cache.match(tokens[: blocks * self.block_size], self.extra_key)

    def _load_from_tiers(self, request: Request, tokens: list[int], tiers: dict[str, int]) -> int:
        """Blocks past the device match that the host or disk tier holds, copied into fresh device
        blocks (no more than are free now); return the tokens they cover."""
        assert self.tiers is not None
        start = len(request.block_ids)
        limit = min(len(tokens) // self.block_size - start, self.num_free_blocks)
        hits = self.tiers.fetch(self.extra_key, tokens, start, limit)
        if not hits:
            return 0
        block_ids = self._take(len(hits))  # may evict (and spill) other cached blocks; hits are pinned
        self.tiers.load(hits, block_ids)
        request.block_ids.extend(block_ids)
        request.num_computed_tokens += len(hits) * self.block_size
        self._holders[request.request_id] = request
        for hit in hits:
            tiers[hit.tier] = tiers.get(hit.tier, 0) + self.block_size
        return len(hits) * self.block_size

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self._blocks_short(request, num_new_tokens) <= self.num_free_blocks

    def new_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks `allocate(request, num_new_tokens)` would add to the table (0: it has room). Read-only."""
        return max(0, self._blocks_short(request, num_new_tokens))

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the block table to cover `num_computed_tokens + num_new_tokens` tokens.

        Evicts unused cached blocks when the free list is short. Returns False, changing
        nothing, when even that is not enough.
        """
        need = self._blocks_short(request, num_new_tokens)
        if need <= 0:
            return True
        if need > self.num_free_blocks:
            return False
        request.block_ids.extend(self._take(need))
        self._holders[request.request_id] = request
        return True

    def _take(self, n: int) -> list[int]:
        """`n` blocks from the free list, evicting unused cached blocks when it is short."""
        shortfall = n - self.pool.num_free
        if shortfall > 0:
            assert self.prefix_cache is not None
            self.pool.decref(self.prefix_cache.evict(shortfall))
            self.evicted_blocks += shortfall
        return self.pool.allocate(n)

    def free(self, request: Request) -> None:
        """Release the request's blocks, caching the full blocks whose KV is valid.

        Blocks within `num_computed_tokens` join the prefix cache (when enabled); where the
        cache already had those tokens, the request's duplicate blocks are simply freed.
        Leaves `num_computed_tokens` alone: the scheduler decides what it means next.
        """
        block_ids = request.block_ids
        if self.prefix_cache is not None:
            num_full = min(request.num_computed_tokens // self.block_size, len(block_ids))
            if num_full:
                tokens = request.cache_token_prefix(num_full * self.block_size)
                result = self.prefix_cache.insert(tokens, block_ids[:num_full], self.extra_key)
                self.pool.incref(block_ids[result.num_cached_tokens // self.block_size : num_full])
            node = self._locks.pop(request.request_id, None)
            if node is not None:
                self.prefix_cache.unlock(node)
        self.pool.decref(block_ids)
        request.block_ids = []
        self._holders.pop(request.request_id, None)
        if self.state is not None:
            self.state.release(request)

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no request uses; return how many were freed."""
        if self.prefix_cache is None:
            return 0
        evicted = self.prefix_cache.evict(self.prefix_cache.evictable_blocks)
        if self.state is not None:
            self.state.reset()
        self.pool.decref(evicted)
        self.evicted_blocks += len(evicted)
        return len(evicted)

    def check_integrity(self) -> None:
        """Assert pool and tree invariants, and that every reference has exactly one holder."""
        self.pool.check_integrity()
        if self.state is not None:
            self.state.check_integrity()
        expected: Counter[int] = Counter()
        for request in self._holders.values():
            assert NULL_BLOCK not in request.block_ids, f"{request.request_id} holds the null block"
            assert len(set(request.block_ids)) == len(request.block_ids), (
                f"{request.request_id}: duplicate block"
            )
            assert len(request.block_ids) * self.block_size >= request.num_computed_tokens, (
                f"{request.request_id}: {request.num_computed_tokens} computed tokens in {len(request.block_ids)} blocks"
            )
            expected.update(request.block_ids)
        if self.tiers is not None:
            self.tiers.check_integrity()
        if self.prefix_cache is not None:
            self.prefix_cache.check_integrity()
            expected.update(self.prefix_cache.iter_block_ids())
            for block_id in self.prefix_cache.iter_block_ids(evictable_only=True):
                # otherwise evicting it would free nothing, and the free count would lie
                assert self.pool.ref_count(block_id) == 1, f"evictable block {block_id} is used by a request"
        for block_id in range(1, self.pool.num_blocks):
            assert self.pool.ref_count(block_id) == expected[block_id], (
                f"block {block_id}: ref count {self.pool.ref_count(block_id)}, holders {expected[block_id]}"
            )

    def _blocks_short(self, request: Request, num_new_tokens: int) -> int:
        total = request.num_computed_tokens + num_new_tokens
        return self.blocks_needed(total) - len(request.block_ids)


def _both(
    first: Callable[[EvictedBlocks], None] | None, second: Callable[[EvictedBlocks], None]
) -> Callable[[EvictedBlocks], None]:
    if first is None:
        return second

    def hook(evicted: EvictedBlocks) -> None:
        first(evicted)
        second(evicted)

    return hook

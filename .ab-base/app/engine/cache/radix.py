"""Radix prefix cache: token ids -> KV block ids, at block granularity.

Only full blocks are cached, so every node holds a whole number of blocks: its `tokens`
(a multiple of `block_size` ids) and the `block_ids` holding their KV. Children are
keyed by their first block's tokens, so one dict lookup per node finds the only child
that can continue a match. One tree per `extra_key` (a model, an adapter): prefixes in
different namespaces never match each other.

A node's `lock_count` counts the users (running requests) whose matched path passes
through it. Locked blocks are "protected"; unlocked ones are "evictable", and eviction
takes unlocked leaves least recently used first (parents are touched whenever a child
is, so a leaf is never fresher than its parent), trimming blocks from a leaf's tail.
Evictable leaves wait in a heap that is kept up to date as nodes change (stale entries
are skipped when popped), so eviction costs O(log n) per leaf, not a walk of the tree:
once the cache is warm, nearly every allocation evicts.

The tree holds no reference counts of its own: the caller (`KVCacheManager`) keeps one
pool reference per cached block and drops it for the block ids `evict` returns. An
`on_evict` hook sees each evicted run of blocks, with the tokens leading to it, before
the caller frees them: the place where a host-RAM or disk tier can copy the KV out.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import NamedTuple


class RadixNode:
    __slots__ = (
        "block_ids",
        "children",
        "extra_key",
        "last_access",
        "lock_count",
        "node_id",
        "parent",
        "tokens",
    )
    _ids = itertools.count()

    def __init__(self, tokens: tuple[int, ...], block_ids: list[int], extra_key: Hashable) -> None:
        self.tokens = tokens
        self.block_ids = block_ids
        self.extra_key = extra_key
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.parent: RadixNode | None = None
        self.lock_count = 0
        self.last_access = 0
        self.node_id = next(RadixNode._ids)  # heap tie-break

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    def path_tokens(self) -> tuple[int, ...]:
        """All tokens from the root down to the end of this node."""
        parts = []
        node: RadixNode | None = self
        while node is not None:
            parts.append(node.tokens)
            node = node.parent
        return tuple(itertools.chain.from_iterable(reversed(parts)))


class MatchResult(NamedTuple):
    block_ids: list[int]  # KV of token_ids[:num_tokens]; lock `node` before relying on them
    num_tokens: int
    node: RadixNode  # the handle to lock/unlock: the deepest matched node (a root on a miss)


class InsertResult(NamedTuple):
    num_cached_tokens: int  # leading tokens that were already cached (their given block ids were not taken)
    node: RadixNode  # the node ending at the last inserted token


class EvictedBlocks(NamedTuple):
    extra_key: Hashable
    token_ids: tuple[int, ...]  # the whole prefix, up to and including the evicted blocks' tokens
    block_ids: list[int]  # KV of the last len(block_ids) * block_size tokens of token_ids


class RadixCache:
    def __init__(self, block_size: int, on_evict: Callable[[EvictedBlocks], None] | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.on_evict = on_evict
        self._roots: dict[Hashable, RadixNode] = {}
        self._clock = 0  # logical time for LRU: deterministic, unlike wall time
        # (last_access, node_id, leaf) for every evictable leaf, plus stale entries skipped on pop
        self._lru: list[tuple[int, int, RadixNode]] = []
        self._num_nodes = 0
        self.evictable_blocks = 0
        self.protected_blocks = 0

    @property
    def num_blocks(self) -> int:
        return self.evictable_blocks + self.protected_blocks

    def match(self, token_ids: Sequence[int], extra_key: Hashable = None) -> MatchResult:
        """Find the longest cached prefix of `token_ids` (whole blocks only).

        Cache content does not change; the access time of the matched path does, and a
        node matched only partly is split in two so the handle ends exactly at the match.
        """
        root = self._roots.get(extra_key)
        if root is None:
            return MatchResult([], 0, self._root(extra_key))
        node, num_blocks = self._walk(root, self._full_blocks(token_ids))
        self._offer(node)  # its access time changed
        block_ids: list[int] = []
        parts = []
        walker: RadixNode | None = node
        while walker is not None:
            parts.append(walker.block_ids)
            walker = walker.parent
        for part in reversed(parts):
            block_ids.extend(part)
        return MatchResult(block_ids, num_blocks * self.block_size, node)

    def insert(
        self, token_ids: Sequence[int], block_ids: Sequence[int], extra_key: Hashable = None
    ) -> InsertResult:
        """Cache `block_ids` as the KV of `token_ids` (len(token_ids) == len(block_ids) * block_size).

        Modifies the tree: the part of the prefix not cached yet becomes a new, unlocked
        leaf holding the matching tail of `block_ids`. Blocks for the part already cached
        are not taken: the caller keeps (and usually frees) its own copies of them.
        """
        if len(token_ids) != len(block_ids) * self.block_size:
            raise ValueError(
                f"insert needs {len(block_ids) * self.block_size} tokens for {len(block_ids)} blocks, "
                f"got {len(token_ids)}"
            )
        tokens = tuple(token_ids)
        node, num_cached = self._walk(self._root(extra_key), tokens)
        if num_cached < len(block_ids):
            leaf = RadixNode(tokens[num_cached * self.block_size :], list(block_ids[num_cached:]), extra_key)
            leaf.last_access = self._clock
            self._attach(leaf, node)
            self._num_nodes += 1
            self.evictable_blocks += leaf.num_blocks
            node = leaf
        self._offer(node)
        return InsertResult(num_cached * self.block_size, node)

    def lock(self, node: RadixNode) -> None:
        """Protect `node` and its ancestors from eviction (counters move evictable -> protected)."""
        walker: RadixNode | None = node
        while walker is not None and not walker.is_root:
            if walker.lock_count == 0:
                self.evictable_blocks -= walker.num_blocks
                self.protected_blocks += walker.num_blocks
            walker.lock_count += 1
            walker = walker.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one `lock(node)`; the tree's content does not change."""
        walker: RadixNode | None = node
        while walker is not None and not walker.is_root:
            if walker.lock_count <= 0:
                raise ValueError("unlock of a radix node that is not locked")
            walker.lock_count -= 1
            if walker.lock_count == 0:
                self.evictable_blocks += walker.num_blocks
                self.protected_blocks -= walker.num_blocks
                self._offer(walker)
            walker = walker.parent

    def evict(self, num_blocks: int) -> list[int]:
        """Remove `num_blocks` unlocked blocks, least recently used leaves first.

        Modifies the tree. Returns the evicted block ids, exactly `num_blocks` of them (a
        leaf is trimmed from its tail rather than dropped whole when that is enough);
        the caller releases them. Raises ValueError if fewer blocks are evictable.
        """
        if num_blocks > self.evictable_blocks:
            raise ValueError(f"cannot evict {num_blocks} blocks: only {self.evictable_blocks} are evictable")
        evicted: list[int] = []
        while len(evicted) < num_blocks:
            last_access, _, leaf = heapq.heappop(self._lru)
            if last_access != leaf.last_access or not self._is_evictable_leaf(leaf):
                continue  # stale: touched, locked, given a child or removed since it was pushed
            take = min(num_blocks - len(evicted), leaf.num_blocks)
            self._report_eviction(leaf, take)
            evicted.extend(leaf.block_ids[leaf.num_blocks - take :])
            self.evictable_blocks -= take
            if take < leaf.num_blocks:
                del leaf.block_ids[leaf.num_blocks - take :]
                leaf.tokens = leaf.tokens[: leaf.num_blocks * self.block_size]
                self._offer(leaf)
                continue
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[: self.block_size]]
            leaf.parent = None
            self._num_nodes -= 1
            self._offer(parent)
        return evicted

    def iter_block_ids(self, evictable_only: bool = False) -> Iterator[int]:
        for node in self._nodes():
            if not (evictable_only and node.lock_count):
                yield from node.block_ids

    def check_integrity(self) -> None:
        """Assert the tree's invariants and that the counters agree with it."""
        evictable = protected = 0
        seen: set[int] = set()
        for node in self._nodes():
            parent = node.parent
            assert parent is not None and node.num_blocks >= 1
            assert len(node.tokens) == node.num_blocks * self.block_size, "node tokens are not whole blocks"
            assert parent.children.get(node.tokens[: self.block_size]) is node, (
                "child keyed by the wrong block"
            )
            assert node.extra_key == parent.extra_key, "node in another namespace's tree"
            assert node.lock_count >= sum(c.lock_count for c in node.children.values()), (
                "lock not on ancestors"
            )
            assert parent.is_root or parent.last_access >= node.last_access, "child fresher than its parent"
            assert seen.isdisjoint(node.block_ids), "a block is cached twice"
            seen.update(node.block_ids)
            if node.lock_count:
                protected += node.num_blocks
            else:
                evictable += node.num_blocks
        queued = {node_id for last_access, node_id, node in self._lru if last_access == node.last_access}
        for node in self._nodes():
            if self._is_evictable_leaf(node):
                assert node.node_id in queued, "an evictable leaf is missing from the LRU heap"
        assert (evictable, protected) == (self.evictable_blocks, self.protected_blocks), (
            f"counters {(self.evictable_blocks, self.protected_blocks)} != tree {(evictable, protected)}"
        )

    # --- internals ---

    def _root(self, extra_key: Hashable) -> RadixNode:
        root = self._roots.get(extra_key)
        if root is None:
            root = self._roots[extra_key] = RadixNode((), [], extra_key)
        return root

    def _full_blocks(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        end = len(token_ids) // self.block_size * self.block_size
        # no slice when the ids are whole blocks already (the manager passes them so): one copy
        # of a 32k-token prefix instead of two
        return tuple(token_ids) if end == len(token_ids) else tuple(token_ids[:end])

    def _walk(self, root: RadixNode, tokens: tuple[int, ...]) -> tuple[RadixNode, int]:
        """Follow `tokens` (whole blocks) from `root`; return the deepest node matched and
        the number of blocks matched. Touches the path; splits a node matched only partly."""
        self._clock += 1
        size = self.block_size
        node, pos = root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos : pos + size])
            if child is None:
                break
            matched = self._common_blocks(child.tokens, tokens, pos)
            partial = matched < child.num_blocks
            if partial:
                child = self._split(child, matched)
            child.last_access = self._clock
            node, pos = child, pos + matched * size
            if partial:
                break
        return node, pos // size

    def _common_blocks(self, key: tuple[int, ...], tokens: tuple[int, ...], pos: int) -> int:
        size = self.block_size
        limit = min(len(key), len(tokens) - pos) // size
        if key[: limit * size] == tokens[pos : pos + limit * size]:
            return limit
        matched = 1  # the first block matched: it is the child's key
        while (
            matched < limit
            and key[matched * size : (matched + 1) * size]
            == tokens[pos + matched * size : pos + (matched + 1) * size]
        ):
            matched += 1
        return matched

    def _split(self, node: RadixNode, num_blocks: int) -> RadixNode:
        """Cut `node` after `num_blocks` blocks; return the new upper part (same lock and age)."""
        size = self.block_size
        parent = node.parent
        assert parent is not None and 0 < num_blocks < node.num_blocks
        upper = RadixNode(node.tokens[: num_blocks * size], node.block_ids[:num_blocks], node.extra_key)
        upper.lock_count = node.lock_count
        upper.last_access = node.last_access
        node.tokens = node.tokens[num_blocks * size :]
        node.block_ids = node.block_ids[num_blocks:]
        self._attach(upper, parent)  # replaces `node` under the same first-block key
        self._attach(node, upper)
        self._num_nodes += 1
        return upper

    def _attach(self, child: RadixNode, parent: RadixNode) -> None:
        child.parent = parent
        parent.children[child.tokens[: self.block_size]] = child

    def _nodes(self) -> Iterator[RadixNode]:
        """Every non-root node, parents before children."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @staticmethod
    def _is_evictable_leaf(node: RadixNode) -> bool:
        return node.parent is not None and not node.children and node.lock_count == 0

    def _offer(self, node: RadixNode) -> None:
        """Queue `node` for eviction if it is now an unlocked leaf (called whenever a node
        may have become one, or its access time changed)."""
        if not self._is_evictable_leaf(node):
            return
        heapq.heappush(self._lru, (node.last_access, node.node_id, node))
        if len(self._lru) > 2 * self._num_nodes + 64:  # too many stale entries: rebuild
            self._lru = [(n.last_access, n.node_id, n) for n in self._nodes() if self._is_evictable_leaf(n)]
            heapq.heapify(self._lru)

    def _report_eviction(self, leaf: RadixNode, take: int) -> None:
        if self.on_evict is None:
            return
        end = leaf.path_tokens()
        self.on_evict(EvictedBlocks(leaf.extra_key, end, leaf.block_ids[leaf.num_blocks - take :]))

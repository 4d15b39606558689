"""Rows of a hybrid model's recurrent state arrays: live slots and prefix-cache snapshots.

Integers only. Every recurrent layer's state arrays are `[num_rows, *shape]` (float32, allocated
by the engine: `alloc_state_arrays`); one row number names the same row in all of them. Row 0 is
the null row (never handed out: a padded batch row may point at it without touching live state),
rows `1..num_slots` are the running sequences' slots (one per sequence, held from admission to
finish, abort or preemption), and the rest are snapshots: copies of a sequence's state at a
block-aligned point of its tokens, kept for the prefix cache (cache/state_cache.py) so a later
request sharing those tokens resumes the recurrent layers there instead of from zero.

A snapshot row is free, reserved (a save is planned into it, or a running request holds it), or
published under a prefix key; published rows are evicted least recently used first when a save
needs a row and none is free (`on_evict` sees each: the place to spill it to host RAM). The same
bookkeeping names the rows of the host-RAM snapshot tier.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Any

NULL_ROW = 0


class StateSlots:
    """Live sequence slots `1..num_slots` (a free list)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be at least 1, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(1, num_slots + 1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise ValueError(f"no free state slot: all {self.num_slots} are held")
        slot = self._free.popleft()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"state slot {slot} is not held")
        self._used.remove(slot)
        self._free.append(slot)

    def check_integrity(self) -> None:
        assert len(self._free) + len(self._used) == self.num_slots, "a state slot is lost or doubled"
        assert self._used.isdisjoint(self._free), "a state slot is both free and held"


class SnapshotRows:
    """Snapshot rows `first..first+num_rows-1`: free, reserved, or published under a key (LRU)."""

    def __init__(
        self, first: int, num_rows: int, on_evict: Callable[[Hashable, int], None] | None = None
    ) -> None:
        if num_rows < 0:
            raise ValueError(f"num_rows must not be negative, got {num_rows}")
        self.first, self.num_rows = first, num_rows
        self.on_evict = on_evict  # (key, row) of a published row about to be reused
        self._free: deque[int] = deque(range(first, first + num_rows))
        self._reserved: set[int] = set()
        self._published: OrderedDict[Hashable, int] = OrderedDict()  # key -> row, oldest first
        self.evictions = 0

    @property
    def num_published(self) -> int:
        return len(self._published)

    def lookup(self, key: Hashable) -> int | None:
        """The row published under `key` (now the most recently used), or None."""
        row = self._published.get(key)
        if row is not None:
            self._published.move_to_end(key)
        return row

    def lookup_quiet(self, key: Hashable) -> int | None:
        """The row published under `key`, the LRU order left alone."""
        return self._published.get(key)

    def contains(self, key: Hashable) -> bool:
        """Whether `key` is published (read-only: the LRU order does not change)."""
        return key in self._published

    def reserve(self) -> int | None:
        """A row for a new snapshot: a free one, else the least recently used published one
        (evicted); None when every row is reserved."""
        if self._free:
            row = self._free.popleft()
        elif self._published:
            key, row = self._published.popitem(last=False)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(key, row)
        else:
            return None
        self._reserved.add(row)
        return row

    def publish(self, row: int, key: Hashable) -> None:
        """Make reserved `row` the snapshot of `key`; a row already published there is freed."""
        self._reserved.remove(row)
        old = self._published.pop(key, None)
        if old is not None:
            self._free.append(old)
        self._published[key] = row

    def release(self, row: int) -> None:
        """Give back a reserved row without publishing it."""
        self._reserved.remove(row)
        self._free.append(row)

    def clear(self) -> int:
        """Free every published row; return how many."""
        rows = list(self._published.values())
        self._published.clear()
        self._free.extend(rows)
        return len(rows)

    def check_integrity(self) -> None:
        published = set(self._published.values())
        assert len(published) == len(self._published), "a snapshot row is published twice"
        parts: list[Any] = [set(self._free), self._reserved, published]
        assert sum(len(p) for p in parts) == self.num_rows, "a snapshot row is lost or doubled"
        assert set().union(*parts) == set(range(self.first, self.first + self.num_rows)), "a stray row"

"""Offload tiers for evicted prefix blocks: host RAM, then a disk folder; a hit copies them back.

When the radix tree evicts a run of blocks (`RadixCache.on_evict`), `KVTiers.spill` copies their
KV out of the device pool before the pool reuses them: into the host tier while it has room
(on CUDA: pinned rows, copied asynchronously on the compute stream), and the host tier's least
recently used rows go down to the disk tier when it needs room. A request whose prefix goes on
past what the tree holds asks `fetch` for the next blocks in the lower tiers and `load`s them
into fresh device blocks, instead of recomputing them.

Blocks are named by a chained hash of the token prefix that ends with them (`prefix_hashes`):
block i's name covers the namespace and every token up to the end of block i, so equal names
mean equal KV for one model and layout. Host entries live only as long as the engine. Disk
entries are files in a folder per (model fingerprint, layout) (`disk_tier.py`), checked on read
and found again after a restart.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from app.engine.backend.base import Backend
from app.engine.cache.disk_tier import DiskTier
from app.engine.cache.host_chunks import HostChunks
from app.engine.cache.radix import EvictedBlocks

HASH_BYTES = 16
HOST_CHUNK_BYTES = 256 << 20  # host rows are allocated in chunks of about this size (host_chunks.py)


def prefix_hashes(extra_key: Hashable, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """One name per full block of `token_ids`: block i's covers the namespace and tokens[: (i + 1) * bs]."""
    ids = np.asarray(token_ids[: len(token_ids) // block_size * block_size], dtype=np.int64)
    digest = hashlib.blake2b(repr(extra_key).encode(), digest_size=HASH_BYTES).digest()
    names = []
    for start in range(0, len(ids), block_size):
        digest = hashlib.blake2b(digest + ids[start : start + block_size].tobytes(), digest_size=HASH_BYTES).digest()
        names.append(digest)
    return names


class BlockCopier(Protocol):
    """The device side: block payloads between the KV pool and host rows (backend primitives)."""

    block_nbytes: int

    def alloc_host(self, num_rows: int) -> np.ndarray: ...
    def read(self, block_ids: Sequence[int], out: np.ndarray) -> None: ...
    def write(self, block_ids: Sequence[int], src: np.ndarray) -> None: ...
    def sync(self) -> None: ...


class DeviceBlocks:
    """`BlockCopier` over a backend's `read_kv_blocks` / `write_kv_blocks` and the engine's caches."""

    def __init__(self, backend: Backend, kv_caches: list[tuple[Any, Any]]) -> None:
        from app.engine.backend.kv_blocks import block_nbytes

        self.backend, self.kv_caches = backend, kv_caches
        self.block_nbytes = block_nbytes(kv_caches)

    def alloc_host(self, num_rows: int) -> np.ndarray:
        return self.backend.alloc_host_blocks(num_rows, self.block_nbytes)

    def read(self, block_ids: Sequence[int], out: np.ndarray) -> None:
        self.backend.read_kv_blocks(self.kv_caches, block_ids, out)

    def write(self, block_ids: Sequence[int], src: np.ndarray) -> None:
        self.backend.write_kv_blocks(self.kv_caches, block_ids, src)

    def sync(self) -> None:
        self.backend.sync_kv_copies()


class HostTier:
    """Prefix hash -> a host row holding that block's payload; least recently used goes first.

    Rows come in chunks made on a thread from the start (host_chunks.py: pinning takes seconds, which a
    step must not wait for), up to `capacity` rows. A pinned entry (fetched, not yet loaded back) is never evicted."""

    def __init__(self, capacity: int, copier: BlockCopier) -> None:
        self.capacity = capacity
        self._copier = copier
        self._chunk_rows = max(1, min(capacity, HOST_CHUNK_BYTES // max(1, copier.block_nbytes)))
        self._chunks = HostChunks(copier.alloc_host, capacity, self._chunk_rows)
        self._taken_rows = 0  # rows of the chunks handed to _free so far (the first chunks, in order)
        self._free: list[int] = []
        self._rows: OrderedDict[bytes, int] = OrderedDict()  # LRU order: oldest first
        self._pins: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, name: bytes) -> bool:
        return name in self._rows

    def names(self) -> list[bytes]:
        return list(self._rows)

    def row(self, name: bytes) -> np.ndarray:
        """The entry's payload row (a view: read it after the copier's sync)."""
        return self._row_view(self._rows[name])

    def touch(self, name: bytes) -> None:
        self._rows.move_to_end(name)

    def pin(self, name: bytes) -> None:
        self._pins[name] = self._pins.get(name, 0) + 1

    def unpin(self, name: bytes) -> None:
        count = self._pins[name] - 1
        if count:
            self._pins[name] = count
        else:
            del self._pins[name]

    def claim(self, name: bytes, spill_down: Callable[[bytes, np.ndarray], None]) -> np.ndarray | None:
        """A row for a new entry `name`: a free one, a new chunk's, or the least recently used
        unpinned entry's after `spill_down(its name, its row)`. None when every row is pinned."""
        if not self._free and self._taken_rows < self.capacity:
            first = self._taken_rows
            rows = len(self._chunks.chunk(first // self._chunk_rows))
            self._taken_rows += rows
            self._free.extend(range(first + rows - 1, first - 1, -1))
        if not self._free:
            victim = next((n for n in self._rows if n not in self._pins), None)
            if victim is None:
                return None
            spill_down(victim, self.row(victim))
            self._free.append(self._rows.pop(victim))
        index = self._free.pop()
        self._rows[name] = index
        return self._row_view(index)

    def drop(self, name: bytes) -> None:
        if name not in self._pins:
            self._free.append(self._rows.pop(name))

    def check_integrity(self) -> None:
        used = list(self._rows.values())
        assert len(set(used)) == len(used), "a host row holds two entries"
        assert set(used).isdisjoint(self._free), "a host row is both used and free"
        assert len(used) + len(self._free) == self._taken_rows <= self.capacity
        assert all(name in self._rows and count > 0 for name, count in self._pins.items())

    def _row_view(self, index: int) -> np.ndarray:
        return self._chunks.row(index)

    def close(self) -> None:
        """Stop making host chunks ahead of need (engine shutdown)."""
        self._chunks.close()

    @property
    def making_ahead(self) -> bool:
        return self._chunks.making_ahead


class Hit(NamedTuple):
    name: bytes
    tier: str  # "host" or "disk"
    payload: np.ndarray  # a host row (pinned in the host tier until loaded or released) or a disk read


@dataclass
class TierStats:
    """Counters for /metrics and the request log (blocks and bytes since start)."""

    hit_blocks: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    spilled_blocks: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    bytes_to_host: int = 0  # device -> host rows
    bytes_from_host: int = 0  # host rows and disk reads -> device
    bytes_to_disk: int = 0
    bytes_from_disk: int = 0
    dropped_blocks: int = 0  # evicted with nowhere to go (the tiers full of pinned rows, or none)


class KVTiers:
    def __init__(self, copier: BlockCopier, block_size: int, host: HostTier | None, disk: DiskTier | None) -> None:
        if host is None and disk is None:
            raise ValueError("KVTiers needs a host tier, a disk tier or both")
        self.copier, self.block_size, self.host, self.disk = copier, block_size, host, disk
        self.stats = TierStats()

    # -- down: device -> host -> disk ------------------------------------------------------
    def spill(self, evicted: EvictedBlocks) -> None:
        """Copy an evicted run of blocks out of the device pool (the radix tree's on_evict hook)."""
        names = prefix_hashes(evicted.extra_key, evicted.token_ids, self.block_size)[-len(evicted.block_ids) :]
        to_disk: list[tuple[bytes, int]] = []
        for name, block_id in zip(names, evicted.block_ids, strict=True):
            if self.host is not None and name in self.host:
                self.host.touch(name)  # already there: a block that was loaded back and evicted again
                continue
            row = self.host.claim(name, self._spill_down) if self.host is not None else None
            if row is not None:
                # copied now, before a later claim of this same spill could take the row again
                self.copier.read([block_id], row[None])
                self.stats.spilled_blocks["host"] += 1
                self.stats.bytes_to_host += self.copier.block_nbytes
            elif self.disk is not None and name not in self.disk:
                to_disk.append((name, block_id))
            elif self.disk is None:
                self.stats.dropped_blocks += 1
        if to_disk:
            staging = self.copier.alloc_host(len(to_disk))
            self.copier.read([b for _, b in to_disk], staging)
            self.copier.sync()
            for (name, _), row in zip(to_disk, staging, strict=True):
                self._write_disk(name, row)

    def flush_host_to_disk(self) -> int:
        """Move every unpinned host entry down to the disk tier (shutdown, tests); return how many."""
        if self.host is None or self.disk is None:
            return 0
        moved = 0
        for name in self.host.names():
            self._spill_down(name, self.host.row(name))
            self.host.drop(name)
            moved += 1
        return moved

    def _spill_down(self, name: bytes, row: np.ndarray) -> None:
        if self.disk is not None and name not in self.disk:
            self.copier.sync()  # the row may still be on its way from the device
            self._write_disk(name, row)

    def _write_disk(self, name: bytes, row: np.ndarray) -> None:
        assert self.disk is not None
        if self.disk.write(name, row):
            self.stats.spilled_blocks["disk"] += 1
            self.stats.bytes_to_disk += row.nbytes

    # -- up: host or disk -> device --------------------------------------------------------
    def fetch(self, extra_key: Hashable, token_ids: Sequence[int], start_block: int, limit: int) -> list[Hit]:
        """The blocks `start_block, start_block + 1, ...` of `token_ids` that a lower tier holds, up
        to `limit` and the first miss. Host rows are pinned until `load` or `release`; disk files are
        read and checked here (a bad one ends the run and is deleted)."""
        if limit <= 0:
            return []
        names = prefix_hashes(extra_key, token_ids, self.block_size)[start_block : start_block + limit]
        hits: list[Hit] = []
        for name in names:
            if self.host is not None and name in self.host:
                self.host.pin(name)
                self.host.touch(name)
                hits.append(Hit(name, "host", self.host.row(name)))
                continue
            payload = self.disk.read(name) if self.disk is not None else None
            if payload is None:
                break
            hits.append(Hit(name, "disk", payload))
        return hits

    def load(self, hits: list[Hit], block_ids: Sequence[int]) -> None:
        """Copy fetched payloads into device blocks (one each, in order) and release the hits."""
        if len(hits) != len(block_ids):
            raise ValueError(f"load of {len(hits)} fetched blocks into {len(block_ids)} device blocks")
        if hits:
            self.copier.sync()  # a row fetched this step may still be arriving from the device
        for hit, block_id in zip(hits, block_ids, strict=True):
            self.copier.write([block_id], hit.payload[None])
            self.stats.hit_blocks[hit.tier] += 1
            self.stats.bytes_from_host += self.copier.block_nbytes
            if hit.tier == "disk":
                self.stats.bytes_from_disk += self.copier.block_nbytes
        self.release(hits)

    def release(self, hits: list[Hit]) -> None:
        for hit in hits:
            if hit.tier == "host" and self.host is not None:
                self.host.unpin(hit.name)

    def check_integrity(self) -> None:
        if self.host is not None:
            self.host.check_integrity()


def kv_bytes_moved(tiers: KVTiers | None) -> dict[str, int]:
    """The tiers' byte counters under /metrics' names (zeros without tiers)."""
    stats = tiers.stats if tiers is not None else TierStats()
    return {
        "device_to_host": stats.bytes_to_host,
        "host_to_device": stats.bytes_from_host,
        "to_disk": stats.bytes_to_disk,
        "from_disk": stats.bytes_from_disk,
    }

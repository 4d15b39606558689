"""Offload tiers for evicted prefix blocks: host RAM, then a disk folder; a hit copies them back.

When the radix tree evicts a run of blocks (`RadixCache.on_evict`), `KVTiers.spill` copies their
KV out of the device pool before the pool reuses them: into the host tier while it has room
(on CUDA: pinned rows, copied asynchronously on the compute stream), and the host tier's least
recently used rows go down to the disk tier when it needs room. A request whose prefix goes on
past what the tree holds asks `fetch` for the next blocks in the lower tiers and `load`s them
into fresh device blocks, instead of recomputing them.

Every direction moves a whole batch in one copier call (one gather or scatter per cache leaf,
backend/kv_blocks.py): a spill's blocks, a load's hits, host and disk alike. A fetch reads its disk
files on the disk tier's threads, into free host rows where there are some (pinned on CUDA: the copy
up is then asynchronous; the block stays in the host tier, as a loaded host hit does).

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
    def read(self, block_ids: Sequence[int], out: Sequence[np.ndarray]) -> None:
        """Blocks -> host rows (one call for them all); `out` valid after `sync`."""
    def write(self, block_ids: Sequence[int], src: Sequence[np.ndarray]) -> None:
        """Host rows -> blocks (one call for them all), ordered after every read before it (a row read
        out and written back needs no sync between); `src` may be rewritten by the host after `sync`."""
    def sync(self) -> None: ...


class DeviceBlocks:
    """`BlockCopier` over a backend's `read_kv_blocks` / `write_kv_blocks` and the engine's caches."""

    def __init__(self, backend: Backend, kv_caches: list[tuple[Any, Any]]) -> None:
        from app.engine.backend.kv_blocks import block_nbytes

        self.backend, self.kv_caches = backend, kv_caches
        self.block_nbytes = block_nbytes(kv_caches)

    def alloc_host(self, num_rows: int) -> np.ndarray:
        return self.backend.alloc_host_blocks(num_rows, self.block_nbytes)

    def read(self, block_ids: Sequence[int], out: Sequence[np.ndarray]) -> None:
        self.backend.read_kv_blocks(self.kv_caches, block_ids, out)

    def write(self, block_ids: Sequence[int], src: Sequence[np.ndarray]) -> None:
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

    def claim_free(self, name: bytes) -> np.ndarray | None:
        """`claim` without evicting anything (None when every row is taken): a row for a disk read."""
        if not self._free and self._taken_rows >= self.capacity:
            return None
        return self.claim(name, _never_spills)

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


def _never_spills(name: bytes, row: np.ndarray) -> None:
    raise AssertionError("claim_free evicted a host entry")


class Hit(NamedTuple):
    name: bytes
    tier: str  # "host" or "disk": where the block was found
    payload: np.ndarray  # a host row or a disk read (into a host row where one was free)
    in_host: bool = False  # the payload is a host row, pinned in the host tier until loaded or released


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
        """Copy an evicted run of blocks out of the device pool (the radix tree's on_evict hook): those
        that get host rows in one copier read, the rest (no room left) in another, then to disk."""
        names = prefix_hashes(evicted.extra_key, evicted.token_ids, self.block_size)[-len(evicted.block_ids) :]
        to_host: dict[bytes, tuple[int, np.ndarray]] = {}  # claimed rows whose copy is not started yet
        to_disk: list[tuple[bytes, int]] = []

        def spill_down(victim: bytes, row: np.ndarray) -> None:
            if victim in to_host:  # a row claimed by this same spill: its block goes out before it is reused
                self._read_into_host(to_host)
            self._spill_down(victim, row)

        for name, block_id in zip(names, evicted.block_ids, strict=True):
            if self.host is not None and name in self.host:
                self.host.touch(name)  # already there: a block that was loaded back and evicted again
                continue
            row = self.host.claim(name, spill_down) if self.host is not None else None
            if row is not None:
                to_host[name] = (block_id, row)
            elif self.disk is not None and name not in self.disk:
                to_disk.append((name, block_id))
            elif self.disk is None:
                self.stats.dropped_blocks += 1
        self._read_into_host(to_host)
        if to_disk:
            staging = np.empty((len(to_disk), self.copier.block_nbytes), np.uint8)  # pageable: read once, soon
            self.copier.read([b for _, b in to_disk], staging)
            self.copier.sync()
            self._write_disk([name for name, _ in to_disk], list(staging))

    def _read_into_host(self, to_host: dict[bytes, tuple[int, np.ndarray]]) -> None:
        """Start the copies of claimed host rows, all in one read; empty `to_host`."""
        if to_host:
            self.copier.read([b for b, _ in to_host.values()], [row for _, row in to_host.values()])
            self.stats.spilled_blocks["host"] += len(to_host)
            self.stats.bytes_to_host += len(to_host) * self.copier.block_nbytes
            to_host.clear()

    def flush_host_to_disk(self) -> int:
        """Move every unpinned host entry down to the disk tier (shutdown, tests); return how many."""
        if self.host is None or self.disk is None:
            return 0
        names = self.host.names()
        self.copier.sync()  # rows may still be on their way from the device
        down = [name for name in names if name not in self.disk]
        self._write_disk(down, [self.host.row(name) for name in down])
        for name in names:
            self.host.drop(name)
        return len(names)

    def _spill_down(self, name: bytes, row: np.ndarray) -> None:
        if self.disk is not None and name not in self.disk:
            self.copier.sync()  # the row may still be on its way from the device
            self._write_disk([name], [row])

    def _write_disk(self, names: list[bytes], rows: list[np.ndarray]) -> None:
        """Write blocks to the disk tier, all at once (its threads write the files)."""
        assert self.disk is not None
        stored = self.disk.write_many(list(zip(names, rows, strict=True)))
        self.stats.spilled_blocks["disk"] += sum(stored)
        self.stats.bytes_to_disk += sum(stored) * self.copier.block_nbytes

    # -- up: host or disk -> device --------------------------------------------------------
    def fetch(self, extra_key: Hashable, token_ids: Sequence[int], start_block: int, limit: int) -> list[Hit]:
        """The blocks `start_block, start_block + 1, ...` of `token_ids` that a lower tier holds, up
        to `limit` and the first miss. Host rows are pinned until `load` or `release`; disk files are
        read and checked here, all at once (a bad one ends the run and is deleted)."""
        if limit <= 0:
            return []
        names = prefix_hashes(extra_key, token_ids, self.block_size)[start_block : start_block + limit]
        run: list[tuple[bytes, str]] = []  # up to the first name neither tier knows
        for name in names:
            if self.host is not None and name in self.host:
                self.host.pin(name)  # before the disk rows are claimed, which must not take this one
                self.host.touch(name)
                run.append((name, "host"))
            elif self.disk is not None and name in self.disk:
                run.append((name, "disk"))
            else:
                break
        read = self._read_disk([name for name, tier in run if tier == "disk"])
        hits: list[Hit] = []
        for name, tier in run:
            if tier == "host":
                hit: Hit | None = Hit(name, "host", self.host.row(name), in_host=True)  # type: ignore[union-attr]
            else:
                hit = read[name]
            if hit is None:
                break
            hits.append(hit)
        for name, tier in run[len(hits) :]:  # past a bad file: unpin what was pinned for the run
            if tier == "host" or ((hit := read[name]) is not None and hit.in_host):
                self.host.unpin(name)  # type: ignore[union-attr]
        return hits

    def _read_disk(self, names: list[bytes]) -> dict[bytes, Hit | None]:
        """The disk blocks `names`, read at once: into free host rows (pinned until loaded, as host hits
        are) where there are some; a file that fails leaves no entry behind."""
        if not names:
            return {}
        assert self.disk is not None
        rows = [self.host.claim_free(name) if self.host is not None else None for name in names]
        held = [name for name, row in zip(names, rows, strict=True) if row is not None]
        for name in held:
            self.host.pin(name)  # type: ignore[union-attr]
        if held:
            self.copier.sync()  # a free row may be the source of a copy up still in flight
        payloads = self.disk.read_many(names, rows)
        read: dict[bytes, Hit | None] = {}
        for name, row, payload in zip(names, rows, payloads, strict=True):
            read[name] = None if payload is None else Hit(name, "disk", payload, in_host=row is not None)
            if row is not None and payload is None:
                self.host.unpin(name)  # type: ignore[union-attr]
                self.host.drop(name)  # type: ignore[union-attr]
        return read

    def load(self, hits: list[Hit], block_ids: Sequence[int]) -> None:
        """Copy fetched payloads into device blocks (one each, in order; one copier write for them all)
        and release the hits."""
        if len(hits) != len(block_ids):
            raise ValueError(f"load of {len(hits)} fetched blocks into {len(block_ids)} device blocks")
        if not hits:
            return
        # No sync: a host row still arriving from the device (spilled this step) is copied up after it,
        # the copier's copies being ordered among themselves (one stream on CUDA).
        self.copier.write(block_ids, [hit.payload for hit in hits])
        for hit in hits:
            self.stats.hit_blocks[hit.tier] += 1
            if hit.tier == "disk":
                self.stats.bytes_from_disk += self.copier.block_nbytes
        self.stats.bytes_from_host += len(hits) * self.copier.block_nbytes
        self.release(hits)

    def release(self, hits: list[Hit]) -> None:
        """Unpin the hits' host rows (after `load`, or for hits not loaded after all)."""
        for hit in hits:
            if hit.in_host and self.host is not None:
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

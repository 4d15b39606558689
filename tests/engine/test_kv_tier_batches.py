"""The tiers move batches: a spill's blocks go down in one copier read, a load's hits (host and disk
together) come up in one copier write, each one indexing per cache leaf; a fetch reads its disk files
at once (into free host rows), and the first bad one still ends the run and is deleted."""

from __future__ import annotations

import struct
import zlib
from typing import ClassVar

import numpy as np
import pytest

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.kv_blocks import (
    cache_leaves,
    gather_blocks,
    gather_into_rows,
    row_runs,
    scatter_blocks,
    scatter_from_rows,
)
from app.engine.cache.disk_tier import HEADER_BYTES, MAGIC, DiskTier, layout_identity
from app.engine.cache.offload import DeviceBlocks, HostTier, KVTiers, prefix_hashes
from app.engine.cache.radix import EvictedBlocks

BS = 2
IDENTITY = layout_identity("model-a", "layers=3 kv_heads=1 head_dim=4 block=2")


class Counting(np.ndarray):
    """A KV cache leaf that counts its indexings by an array of block ids (gathers and scatters)."""

    calls: ClassVar[dict[str, int]] = {"get": 0, "set": 0}

    def __getitem__(self, key):
        if isinstance(key, np.ndarray):
            Counting.calls["get"] += 1
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if isinstance(key, np.ndarray):
            Counting.calls["set"] += 1
        super().__setitem__(key, value)


class CountingCopier(DeviceBlocks):
    """The numpy backend's copier, counting calls and blocks per direction."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.reads: list[int] = []
        self.writes: list[int] = []

    def read(self, block_ids, out) -> None:
        self.reads.append(len(block_ids))
        super().read(block_ids, out)

    def write(self, block_ids, src) -> None:
        self.writes.append(len(block_ids))
        super().write(block_ids, src)


def caches(num_blocks: int, dtype: str = "float32", layers: int = 3) -> list:
    """KV caches where block b of layer l holds a pattern of (b, l): where a copy came from shows."""
    backend = CpuBackend()
    out = [backend.alloc_kv_cache(num_blocks, BS, 1, 4, dtype) for _ in range(layers)]
    rng = np.random.default_rng(7)
    for k, v in out:
        slots = np.arange(num_blocks * BS)
        backend.write_kv(k, v, rng.standard_normal((len(slots), 1, 4)).astype(np.float32),
                         rng.standard_normal((len(slots), 1, 4)).astype(np.float32), slots)  # fmt: skip
    return out


def tiers_over(kv, tmp_path, host_rows: int, disk: bool = True, copier_type=CountingCopier) -> KVTiers:
    copier = copier_type(CpuBackend(), kv)
    disk_tier = DiskTier(tmp_path, 1 << 30, IDENTITY, copier.block_nbytes) if disk else None
    return KVTiers(copier, BS, HostTier(host_rows, copier) if host_rows else None, disk_tier)


def blocks_of(kv, block_ids) -> list[np.ndarray]:
    return [np.concatenate([leaf[b].view(np.uint8).ravel() for leaf in cache_leaves(kv)]) for b in block_ids]


def spilled(tmp_path, num_blocks: int, host_rows: int, count: int, dtype: str = "float32"):
    """Caches, tiers, and blocks 0..count-1 spilled as one run: (kv, tiers, tokens, names, their payloads)."""
    kv = caches(num_blocks, dtype)
    tiers = tiers_over(kv, tmp_path, host_rows=host_rows)
    tokens = tuple(range(count * BS))
    before = blocks_of(kv, range(count))
    tiers.spill(EvictedBlocks(None, tokens, list(range(count))))
    return kv, tiers, tokens, prefix_hashes(None, tokens, BS), before


def assert_holds(kv, block_ids, payloads: list[np.ndarray]) -> None:
    for want, got in zip(payloads, blocks_of(kv, block_ids), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_spill_and_a_load_of_many_blocks_are_one_copy_and_one_indexing_per_leaf(tmp_path) -> None:
    kv = [tuple(c.view(Counting) for c in pair) for pair in caches(48)]
    leaves = len(cache_leaves(kv))
    tiers = tiers_over(kv, tmp_path, host_rows=40, disk=False)
    tokens = tuple(range(20 * BS))
    before = blocks_of(kv, range(20))
    Counting.calls.update(get=0, set=0)
    tiers.spill(EvictedBlocks(None, tokens, list(range(20))))
    assert tiers.copier.reads == [20] and Counting.calls == {"get": leaves, "set": 0}
    hits = tiers.fetch(None, tokens, 0, 20)
    assert [h.tier for h in hits] == ["host"] * 20
    tiers.load(hits, list(range(20, 40)))
    assert tiers.copier.writes == [20] and Counting.calls == {"get": leaves, "set": leaves}
    assert_holds(kv, range(20, 40), before)
    tiers.check_integrity()


def test_a_spill_bigger_than_the_host_tier_sends_its_oldest_blocks_down_intact(tmp_path) -> None:
    """A spill whose later blocks take the rows its earlier ones were given: those go out first, then to disk."""
    kv, tiers, tokens, _, before = spilled(tmp_path, 16, 3, 8)
    assert len(tiers.host) == 3 and len(tiers.disk) == 5
    hits = tiers.fetch(None, tokens, 0, 8)
    assert [h.tier for h in hits] == ["disk"] * 5 + ["host"] * 3
    tiers.load(hits, list(range(8, 16)))
    assert_holds(kv, range(8, 16), before)
    tiers.check_integrity()


def test_mixed_host_and_disk_hits_come_back_in_order_in_one_write(tmp_path) -> None:
    kv, tiers, tokens, names, before = spilled(tmp_path, 24, 12, 10)
    tiers.flush_host_to_disk()  # all ten on disk, none in host RAM
    tiers.spill(EvictedBlocks(None, tokens[: 3 * BS], [0, 1, 2]))  # blocks 0-2 in host RAM again
    assert [n in tiers.host for n in names] == [True] * 3 + [False] * 7
    tiers.copier.writes.clear()
    hits = tiers.fetch(None, tokens, 0, 10)
    assert [h.tier for h in hits] == ["host"] * 3 + ["disk"] * 7
    assert all(h.in_host for h in hits)  # the disk reads landed in free host rows
    tiers.load(hits, list(range(10, 20)))
    assert tiers.copier.writes == [10]
    assert_holds(kv, range(10, 20), before)
    assert tiers.stats.hit_blocks == {"host": 3, "disk": 7}
    assert all(n in tiers.host for n in names)  # the disk blocks stay in host RAM, as loaded host hits do
    tiers.check_integrity()


def test_a_bad_file_in_the_middle_ends_the_run_there_and_is_deleted(tmp_path) -> None:
    kv, tiers, tokens, names, before = spilled(tmp_path, 16, 8, 6)
    tiers.flush_host_to_disk()
    path = tiers.disk.path(names[3])
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    hits = tiers.fetch(None, tokens, 0, 6)
    assert [h.name for h in hits] == names[:3]
    assert not path.exists() and names[3] not in tiers.disk and tiers.disk.rejected == 1
    assert names[3] not in tiers.host  # its claimed host row went back
    tiers.load(hits, [8, 9, 10])
    assert_holds(kv, [8, 9, 10], before[:3])
    tiers.check_integrity()  # nothing left pinned: blocks 4 and 5, read past the bad one, were released
    again = tiers.fetch(None, tokens, 4, 2)  # and they are good host entries now
    assert [h.tier for h in again] == ["host", "host"]
    tiers.release(again)
    tiers.check_integrity()


def test_disk_hits_without_a_free_host_row_still_load(tmp_path) -> None:
    kv = caches(16)
    tiers = tiers_over(kv, tmp_path, host_rows=2)
    tokens = tuple(range(6 * BS))
    before = blocks_of(kv, range(4))
    tiers.spill(EvictedBlocks(None, tokens[: 4 * BS], [0, 1, 2, 3]))
    tiers.flush_host_to_disk()
    tiers.spill(EvictedBlocks(None, (9,) * 4 * BS, [4, 5, 6, 7]))  # two other blocks fill the host rows
    hits = tiers.fetch(None, tokens, 0, 6)
    assert [(h.tier, h.in_host) for h in hits] == [("disk", False)] * 4
    tiers.load(hits, [8, 9, 10, 11])
    assert_holds(kv, [8, 9, 10, 11], before)
    tiers.check_integrity()


def test_fp8_caches_go_down_and_come_back_through_both_tiers(tmp_path) -> None:
    kv = caches(16, "fp8")
    assert len(cache_leaves(kv)) == 12  # data and scales of K and V, three layers
    tiers = tiers_over(kv, tmp_path, host_rows=2)
    tokens = tuple(range(5 * BS))
    before = blocks_of(kv, range(5))
    tiers.spill(EvictedBlocks(None, tokens, list(range(5))))
    hits = tiers.fetch(None, tokens, 0, 5)
    assert [h.tier for h in hits] == ["disk"] * 3 + ["host"] * 2
    tiers.load(hits, list(range(10, 15)))
    assert_holds(kv, range(10, 15), before)


def test_block_copies_take_separate_rows_and_refuse_wrong_ones() -> None:
    backend = CpuBackend()
    kv = caches(6)
    nbytes = DeviceBlocks(backend, kv).block_nbytes
    rows = [np.zeros(nbytes, np.uint8) for _ in range(3)]
    backend.read_kv_blocks(kv, [4, 0, 2], rows)
    assert [r.tobytes() for r in rows] == [b.tobytes() for b in blocks_of(kv, [4, 0, 2])]
    with pytest.raises(ValueError, match="2 host rows for 3 KV blocks"):
        backend.write_kv_blocks(kv, [1, 2, 3], rows[:2])
    with pytest.raises(ValueError, match=f"host row is {nbytes} contiguous uint8 bytes"):
        backend.write_kv_blocks(kv, [1], [np.zeros(nbytes - 1, np.uint8)])


@pytest.mark.parametrize("dtype", ["float16", "fp8"])
def test_the_row_copies_lay_payloads_out_as_the_staged_ones_do(dtype) -> None:
    """numpy's row-at-a-time copies against gather_blocks / scatter_blocks, which CUDA stages through."""
    kv = caches(8, dtype)
    ids = np.array([6, 1, 3])
    staged = gather_blocks(np, kv, ids)
    rows = [np.zeros(staged.shape[1], np.uint8) for _ in ids]
    gather_into_rows(kv, ids, rows)
    np.testing.assert_array_equal(np.stack(rows), staged)
    copy = caches(8, dtype)
    other = caches(8, dtype)
    scatter_blocks(np, copy, np.array([0, 2, 4]), staged)
    scatter_from_rows(other, np.array([0, 2, 4]), rows)
    for a, b in zip(cache_leaves(copy), cache_leaves(other), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(gather_blocks(np, other, np.array([0, 2, 4])), staged)


def test_row_runs_join_rows_that_sit_end_to_end() -> None:
    chunk = np.zeros((6, 8), np.uint8)
    other = np.zeros((2, 8), np.uint8)
    rows = [chunk[0], chunk[1], chunk[2], other[0], chunk[4], chunk[5], chunk[3]]
    base = chunk.ctypes.data
    assert row_runs(rows, 8) == [(0, 3, base), (3, 1, other.ctypes.data), (4, 2, base + 32), (6, 1, base + 24)]


# -- the disk tier's files, read many at a time ------------------------------------------------------
NBYTES = 4096


def disk_with(tmp_path, count: int) -> tuple[DiskTier, list[bytes], list[np.ndarray]]:
    disk = DiskTier(tmp_path, 1 << 30, IDENTITY, NBYTES)
    names = [bytes([i]) * 16 for i in range(count)]
    payloads = [np.random.default_rng(i).integers(0, 256, NBYTES, dtype=np.uint8) for i in range(count)]
    for name, payload in zip(names, payloads, strict=True):
        assert disk.write(name, payload)
    return disk, names, payloads


def test_read_many_reads_into_the_rows_given_and_rejects_bad_files(tmp_path) -> None:
    disk, names, payloads = disk_with(tmp_path, 12)
    disk.path(names[4]).write_bytes(disk.path(names[4]).read_bytes()[:-1])  # truncated
    disk.path(names[7]).write_bytes(disk.path(names[7]).read_bytes() + b"\x00")  # one byte too long
    disk.path(names[9]).unlink()  # gone behind the index's back
    rows = np.zeros((12, NBYTES), np.uint8)
    got = disk.read_many([*names, b"\xee" * 16], [*rows, None])
    for i, payload in enumerate(got[:12]):
        if i in (4, 7, 9):
            assert payload is None and names[i] not in disk
        else:
            assert np.shares_memory(payload, rows[i])
            np.testing.assert_array_equal(rows[i], payloads[i])
    assert got[12] is None
    assert disk.rejected == 2 and not disk.path(names[4]).exists() and not disk.path(names[7]).exists()
    disk.check_integrity()
    disk.close()


def test_a_version_1_file_is_rejected_and_deleted_on_start(tmp_path) -> None:
    """Files of the blake2b format (version 1) are foreign to this one: deleted on start, never read."""
    disk, names, _ = disk_with(tmp_path, 2)
    old = struct.Struct("<4sI32s16sQ16s")
    payload = np.ones(NBYTES, np.uint8)
    header = old.pack(MAGIC, 1, IDENTITY, names[0], NBYTES, zlib.crc32(payload).to_bytes(16, "little"))
    disk.path(names[0]).write_bytes(header + payload.tobytes())
    again = DiskTier(tmp_path, 1 << 30, IDENTITY, NBYTES)
    assert names[0] not in again and names[1] in again and again.rejected == 1
    assert not again.path(names[0]).exists()
    again.check_integrity()


def test_write_many_keeps_the_latest_blocks_when_the_batch_overflows_the_tier(tmp_path) -> None:
    disk, names, payloads = disk_with(tmp_path, 2)
    disk.capacity_bytes = 3 * disk.file_bytes
    batch = [(bytes([100 + i]) * 16, payloads[i % 2]) for i in range(5)]
    assert disk.write_many([(names[1], payloads[1]), *batch]) == [True, False, False, True, True, True]
    assert [name in disk for name, _ in batch] == [False, False, True, True, True]
    assert names[0] not in disk and names[1] not in disk and len(disk) == 3  # the two older files made room
    np.testing.assert_array_equal(disk.read(batch[4][0]), payloads[0])
    disk.check_integrity()


def test_a_file_that_cannot_be_written_is_not_counted(tmp_path) -> None:
    disk, _, payloads = disk_with(tmp_path, 1)
    blocked = b"\x42" * 16
    disk.path(blocked).with_suffix(".tmp").mkdir()  # the temporary file cannot be opened
    assert disk.write_many([(blocked, payloads[0]), (b"\x43" * 16, payloads[0])]) == [False, True]
    assert blocked not in disk and len(disk) == 2
    disk.check_integrity()
    disk.close()


def test_the_start_reads_headers_only_and_a_damaged_payload_is_found_when_read(tmp_path) -> None:
    """A restart does not read whole files: a payload flipped on disk passes the index rebuild (its header is
    sound) and is rejected, and deleted, by the read that would have loaded it."""
    disk, names, payloads = disk_with(tmp_path, 3)
    path = disk.path(names[1])
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x80
    path.write_bytes(bytes(raw))
    again = DiskTier(tmp_path, 1 << 30, IDENTITY, NBYTES)
    assert len(again) == 3 and again.rejected == 0
    got = again.read_many(names)
    assert got[1] is None and not path.exists() and again.rejected == 1
    np.testing.assert_array_equal(got[2], payloads[2])
    again.check_integrity()

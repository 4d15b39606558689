"""The disk tier's files (checked on read, bad ones deleted, the index rebuilt on start), the host
tier's rows, and whole-block copies through the numpy backend's primitives."""

from __future__ import annotations

import os

import numpy as np
import pytest

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.kv_blocks import block_nbytes
from app.engine.cache.disk_tier import HEADER_BYTES, DiskTier, layout_identity, model_fingerprint
from app.engine.cache.offload import DeviceBlocks, HostTier, KVTiers, prefix_hashes
from app.engine.cache.radix import EvictedBlocks

NBYTES = 64
IDENTITY = layout_identity("model-a", "layers=2 kv_heads=1 head_dim=4 block=4 dtype=float32")


def payload(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, NBYTES, dtype=np.uint8)


def tier(root, capacity_blocks: int = 8, identity: bytes = IDENTITY) -> DiskTier:
    return DiskTier(root, capacity_blocks * (HEADER_BYTES + NBYTES), identity, NBYTES)


def test_a_block_written_is_read_back_and_survives_a_restart(tmp_path) -> None:
    disk = tier(tmp_path)
    name = prefix_hashes(None, [1, 2, 3, 4], 4)[0]
    assert disk.write(name, payload(1))
    np.testing.assert_array_equal(disk.read(name), payload(1))
    again = tier(tmp_path)  # a new process on the same folder
    assert name in again and len(again) == 1
    np.testing.assert_array_equal(again.read(name), payload(1))
    again.check_integrity()


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1],  # truncated
        lambda raw: raw[:HEADER_BYTES + 3] + bytes([raw[HEADER_BYTES + 3] ^ 1]) + raw[HEADER_BYTES + 4 :],  # a bit flipped
        lambda raw: b"XXXX" + raw[4:],  # not our magic
    ],
    ids=["truncated", "bit-flip", "magic"],
)
def test_a_damaged_file_is_deleted_and_never_loaded(tmp_path, damage) -> None:
    disk = tier(tmp_path)
    name = b"\x07" * 16
    disk.write(name, payload(2))
    path = disk.path(name)
    path.write_bytes(damage(path.read_bytes()))
    assert disk.read(name) is None
    assert not path.exists() and name not in disk and disk.rejected == 1
    disk.check_integrity()


def test_foreign_and_misnamed_files_are_deleted_on_start(tmp_path) -> None:
    disk = tier(tmp_path)
    name, other = b"\x01" * 16, b"\x02" * 16
    disk.write(name, payload(3))
    # another model's file copied into this folder, a file renamed to another block's name, a stray file
    foreign = tier(tmp_path / "elsewhere", identity=layout_identity("model-b", "same layout"))
    foreign.write(name, payload(4))
    (disk.folder / ("03" * 16 + ".kvb")).write_bytes(foreign.path(name).read_bytes())
    os.replace(disk.path(name), disk.path(other))
    (disk.folder / "notes.txt").write_text("not a block")
    again = tier(tmp_path)
    assert len(again) == 0 and again.rejected == 3
    assert list(again.folder.iterdir()) == []
    assert again.read(other) is None


def test_the_disk_tier_keeps_to_its_size_least_recently_used_first(tmp_path) -> None:
    disk = tier(tmp_path, capacity_blocks=2)
    names = [bytes([i]) * 16 for i in range(3)]
    disk.write(names[0], payload(0))
    disk.write(names[1], payload(1))
    assert disk.read(names[0]) is not None  # now the most recent
    disk.write(names[2], payload(2))
    assert names[1] not in disk and names[0] in disk and names[2] in disk
    assert sorted(p.name for p in disk.folder.iterdir()) == sorted(n.hex() + ".kvb" for n in (names[0], names[2]))
    disk.check_integrity()


def test_model_fingerprint_names_the_file_contents(tmp_path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"\x00" * 300_000)
    b.write_bytes(b"\x00" * 299_999 + b"\x01")
    assert model_fingerprint(a) != model_fingerprint(b)  # the last byte differs: the last chunk is sampled
    assert model_fingerprint(a) == model_fingerprint(a)
    b.write_bytes(b"\x00" * 300_000)
    assert model_fingerprint(a) != model_fingerprint(b)  # same bytes, another file name


def test_prefix_hashes_chain_the_whole_prefix() -> None:
    first = prefix_hashes(None, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(first) == 2  # only full blocks
    assert prefix_hashes(None, [1, 2, 3, 4, 5, 6, 7, 8], 4) == first
    assert prefix_hashes(None, [0, 2, 3, 4, 5, 6, 7, 8], 4)[1] != first[1]  # block 1's name covers block 0
    assert prefix_hashes("adapter", [1, 2, 3, 4], 4)[0] != first[0]  # namespaces never share names


@pytest.mark.parametrize("dtype", ["float32", "float16", "fp8"])
def test_block_copies_round_trip_every_layer(dtype) -> None:
    backend = CpuBackend()
    caches = [backend.alloc_kv_cache(6, 4, 2, 8, dtype) for _ in range(3)]
    rng = np.random.default_rng(0)
    for k_cache, v_cache in caches:
        slots = np.arange(24)
        backend.write_kv(k_cache, v_cache, rng.standard_normal((24, 2, 8)).astype(np.float32),
                         rng.standard_normal((24, 2, 8)).astype(np.float32), slots)  # fmt: skip
    nbytes = block_nbytes(caches)
    host = backend.alloc_host_blocks(2, nbytes)
    backend.read_kv_blocks(caches, [1, 4], host)
    backend.sync_kv_copies()
    copy = [backend.alloc_kv_cache(6, 4, 2, 8, dtype) for _ in range(3)]
    backend.write_kv_blocks(copy, [5, 2], host)
    for (k, v), (k2, v2) in zip(caches, copy, strict=True):
        for src, dst in ((1, 5), (4, 2)):
            for a, b in ((k, k2), (v, v2)):
                leaves_a = a.leaves() if dtype == "fp8" else (a,)
                leaves_b = b.leaves() if dtype == "fp8" else (b,)
                for la, lb in zip(leaves_a, leaves_b, strict=True):
                    np.testing.assert_array_equal(la[src], lb[dst])


def test_host_tier_spills_its_oldest_rows_to_disk_and_never_a_pinned_one(tmp_path) -> None:
    backend = CpuBackend()
    caches = [backend.alloc_kv_cache(8, 2, 1, 4)]
    for block in range(8):
        caches[0][0][block] = block  # K of block b is all b: where a copy came from shows
    copier = DeviceBlocks(backend, caches)
    disk = DiskTier(tmp_path, 100 * (HEADER_BYTES + copier.block_nbytes), IDENTITY, copier.block_nbytes)
    tiers = KVTiers(copier, 2, HostTier(2, copier), disk)
    tokens = tuple(range(6))
    tiers.spill(EvictedBlocks(None, tokens, [3, 4, 5]))  # 3 blocks into a host tier of 2 rows
    assert len(tiers.host) == 2 and len(disk) == 1 and tiers.stats.spilled_blocks == {"host": 3, "disk": 1}
    hits = tiers.fetch(None, tokens, 0, 3)
    assert [h.tier for h in hits] == ["disk", "host", "host"]
    tiers.spill(EvictedBlocks(None, (9, 9, 9, 9), [6, 7]))  # both host rows are pinned by the fetch
    assert len(tiers.host) == 2 and tiers.stats.spilled_blocks["host"] == 3
    tiers.load(hits, [1, 2, 6])
    assert [int(caches[0][0][b].max()) for b in (1, 2, 6)] == [3, 4, 5]
    tiers.check_integrity()

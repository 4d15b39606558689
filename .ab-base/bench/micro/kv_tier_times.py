"""The KV tiers' copies and disk reads on the CPU, before and after batching, at Qwen3-8B's block
(36 layers x (K, V) x 16 tokens x 8 KV heads x 128 float16 = 2.36 MB):

- load / spill: N blocks between host rows and the numpy backend's KV pool, one copier call per block (how
  `KVTiers` moved them before) against one call for all (now); the cache-leaf indexings each made (on CUDA,
  each is a launch: 72 per block before, 72 per batch now).
- disk_write: N block files written one at a time, and on the disk tier's threads (`write_many`: a shutdown).
- disk_fetch: N block files in a temporary folder read and checked, one after the other as before
  (read_bytes, blake2b-128, a copy), one after the other now (CRC-32, read into the row), and on the disk
  tier's thread pool into host rows (`DiskTier.read_many`). The files were just written: the page cache
  holds them, as it did in the GPU run's restart (bench/results/gpu-tiers-s18-2026-12-06.jsonl).

    .venv/bin/python bench/micro/kv_tier_times.py [--blocks 500] [--repeats 3]

One JSON line per case: seconds (best of --repeats), GB/s, and the calls made.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.engine.backend.cpu import CpuBackend
from app.engine.backend.kv_blocks import cache_leaves
from app.engine.cache import disk_tier
from app.engine.cache.disk_tier import HEADER_BYTES, DiskTier, layout_identity
from app.engine.cache.offload import DeviceBlocks

LAYERS, BLOCK, KV_HEADS, HEAD_DIM = 36, 16, 8, 128  # Qwen3-8B, float16


def best(run: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def emit(case: str, way: str, seconds: float, nbytes: int, **extra: object) -> None:
    print(json.dumps({"case": case, "way": way, "seconds": round(seconds, 4),
                      "gb_per_s": round(nbytes / seconds / 1e9, 2), **extra}), flush=True)  # fmt: skip


def copies(n: int, repeats: int) -> None:
    backend = CpuBackend()
    kv = [backend.alloc_kv_cache(2 * n, BLOCK, KV_HEADS, HEAD_DIM, "float16") for _ in range(LAYERS)]
    copier = DeviceBlocks(backend, kv)
    leaves = len(cache_leaves(kv))
    rows = copier.alloc_host(n)
    rows[...] = np.random.default_rng(0).integers(0, 256, rows.shape, dtype=np.uint8)
    ids = list(range(n, 2 * n))
    total = n * copier.block_nbytes

    def per_block_load() -> None:
        for block_id, row in zip(ids, rows, strict=True):
            copier.write([block_id], row[None])

    def per_block_spill() -> None:
        for block_id, row in zip(ids, rows, strict=True):
            copier.read([block_id], row[None])

    emit("load", "per_block", best(per_block_load, repeats), total, copier_calls=n, leaf_indexings=n * leaves)
    emit("load", "batched", best(lambda: copier.write(ids, list(rows)), repeats), total,
         copier_calls=1, leaf_indexings=leaves)  # fmt: skip
    emit("spill", "per_block", best(per_block_spill, repeats), total, copier_calls=n, leaf_indexings=n * leaves)
    emit("spill", "batched", best(lambda: copier.read(ids, list(rows)), repeats), total,
         copier_calls=1, leaf_indexings=leaves)  # fmt: skip


def old_read(path: Path) -> np.ndarray:
    """Version 1's read: the whole file as bytes, blake2b-128 of the payload, a copy out."""
    raw = path.read_bytes()
    payload = np.frombuffer(raw, np.uint8, offset=HEADER_BYTES)
    hashlib.blake2b(payload, digest_size=16).digest()
    return payload.copy()


def disk_fetch(n: int, repeats: int) -> None:
    nbytes = 2 * LAYERS * BLOCK * KV_HEADS * HEAD_DIM * 2
    with tempfile.TemporaryDirectory(prefix="kv-tier-times-") as root:
        disk = DiskTier(root, 1 << 40, layout_identity("bench", "qwen3-8b"), nbytes)
        names = [i.to_bytes(16, "little") for i in range(n)]
        payload = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
        for name in names:
            disk.write(name, payload)
        rows = np.empty((n, nbytes), np.uint8)
        total = n * nbytes
        emit("disk_fetch", "serial_blake2b_v1", best(lambda: [old_read(disk.path(m)) for m in names], repeats),
             total, files=n)  # fmt: skip
        serial = lambda: [disk.read(m, r) for m, r in zip(names, rows, strict=True)]  # noqa: E731
        emit("disk_fetch", "serial_crc32", best(serial, repeats), total, files=n)
        emit("disk_fetch", "pooled_crc32", best(lambda: disk.read_many(names, list(rows)), repeats), total,
             files=n, threads=disk_tier.IO_THREADS)  # fmt: skip
        assert all(np.array_equal(row, payload) for row in rows)
        disk.close()
        folders = itertools.count()

        def write(way: str) -> None:
            """A shutdown's writes: N new files into an empty folder."""
            fresh = DiskTier(Path(root) / f"write-{next(folders)}", 1 << 40, disk.identity, nbytes)
            if way == "serial":
                for name in names:
                    fresh.write(name, payload)
            else:
                fresh.write_many([(name, payload) for name in names])
            fresh.close()

        for way in ("serial", "pooled"):
            emit("disk_write", way, best(lambda way=way: write(way), repeats), total, files=n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="copies,disk", help="which of copies (load, spill), disk")
    args = parser.parse_args()
    if "copies" in args.cases:
        copies(args.blocks, args.repeats)
    if "disk" in args.cases:
        disk_fetch(args.blocks, args.repeats)


if __name__ == "__main__":
    main()

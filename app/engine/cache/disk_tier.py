"""The disk tier: one file per KV block, in a folder per (model fingerprint, layout).

Folder: `<root>/<identity>/` where identity names the model file (a sampled fingerprint of its
bytes, `model_fingerprint`) and the KV layout (layers, KV heads, head dim, block size, dtype,
payload bytes). File: `<prefix hash>.kvb` = a fixed header then the block's payload:

    magic "PDKV" | version u32 | identity 32 bytes | prefix hash 16 bytes | payload bytes u64 |
    blake2b-16 checksum of the payload

Every read checks all of it against what the caller expects; a file that fails (truncated,
flipped bits, another model's or layout's, a wrong name) is deleted and never loaded. On start
the index is rebuilt from the folder (headers checked, oldest modification first for the LRU);
files over `capacity_bytes` go least recently used first. Writes go to a temporary file renamed
into place, so a crash leaves no half-written block under a valid name.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"PDKV"
VERSION = 1
_HEADER = struct.Struct("<4sI32s16sQ16s")
HEADER_BYTES = _HEADER.size
SUFFIX = ".kvb"
_SAMPLES = 16  # fingerprint chunks spread over the model file
_SAMPLE_BYTES = 1 << 16


def model_fingerprint(path: str | os.PathLike[str]) -> str:
    """A hash naming a model's files: their names, sizes and 16 chunks of 64 KiB spread over each
    (hashing every byte of a 16 GB file at each start would take longer than the prefill it saves)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as stream:
            for i in range(_SAMPLES):
                stream.seek(max(0, (size - _SAMPLE_BYTES) * i // max(1, _SAMPLES - 1)))
                digest.update(stream.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def layout_identity(fingerprint: str, layout: str) -> bytes:
    """32 bytes naming (model, layout): files of any other identity are foreign."""
    return hashlib.sha256(f"{fingerprint}|{layout}".encode()).digest()


def user_kv_dir() -> Path:
    """The default disk tier root: the user cache folder's paddock/kv."""
    from app.engine import envs

    root = envs.XDG_CACHE_HOME or envs.LOCALAPPDATA or Path.home() / ".cache"
    return Path(root) / "paddock" / "kv"


class DiskTier:
    def __init__(self, root: str | os.PathLike[str], capacity_bytes: int, identity: bytes, block_nbytes: int) -> None:
        if len(identity) != 32:
            raise ValueError("a disk tier identity is 32 bytes")
        self.identity, self.block_nbytes, self.capacity_bytes = identity, block_nbytes, capacity_bytes
        self.folder = Path(root).expanduser() / identity.hex()[:32]
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index: OrderedDict[bytes, None] = OrderedDict()  # LRU order: oldest first
        self.bytes_used = 0
        self.rejected = 0  # files found bad and deleted
        self._rebuild()

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.block_nbytes

    def __contains__(self, name: bytes) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._index)

    def path(self, name: bytes) -> Path:
        return self.folder / (name.hex() + SUFFIX)

    def write(self, name: bytes, payload: np.ndarray) -> bool:
        """Store one block's payload; False when it cannot fit at all or the write failed."""
        data = np.ascontiguousarray(payload, dtype=np.uint8).reshape(-1)
        if data.nbytes != self.block_nbytes:
            raise ValueError(f"a disk KV block is {self.block_nbytes} bytes, got {data.nbytes}")
        if self.file_bytes > self.capacity_bytes:
            return False
        if name in self._index:
            self._index.move_to_end(name)
            return True
        while self.bytes_used + self.file_bytes > self.capacity_bytes:
            self._remove(next(iter(self._index)))
        header = _HEADER.pack(MAGIC, VERSION, self.identity, name, data.nbytes, _checksum(data))
        target = self.path(name)
        temporary = target.with_suffix(".tmp")
        try:
            with temporary.open("wb") as stream:
                stream.write(header)
                stream.write(data.tobytes())
            os.replace(temporary, target)
        except OSError as exc:  # a full or read-only disk: the block is simply not kept
            log.warning("KV disk tier: could not write %s: %s", target, exc)
            with contextlib.suppress(OSError):
                temporary.unlink()
            return False
        self._index[name] = None
        self.bytes_used += self.file_bytes
        return True

    def read(self, name: bytes) -> np.ndarray | None:
        """The block's payload if its file is there and passes every check; else None (a bad file
        is deleted)."""
        if name not in self._index:
            return None
        try:
            raw = self.path(name).read_bytes()
        except OSError:
            self._forget(name)
            return None
        payload = self._check(raw, name, full=True)
        if payload is None:
            self._reject(name)
            return None
        self._index.move_to_end(name)
        return payload

    def check_integrity(self) -> None:
        assert self.bytes_used == len(self._index) * self.file_bytes
        assert self.bytes_used <= max(self.capacity_bytes, 0)

    # -- internals ------------------------------------------------------------------------
    def _check(self, raw: bytes, name: bytes, full: bool) -> np.ndarray | None:
        if len(raw) < HEADER_BYTES:
            return None
        magic, version, identity, stored_name, size, checksum = _HEADER.unpack_from(raw)
        if (magic, version, identity, stored_name, size) != (MAGIC, VERSION, self.identity, name, self.block_nbytes):
            return None
        if not full:
            return np.empty(0, np.uint8)
        payload = np.frombuffer(raw, np.uint8, offset=HEADER_BYTES)
        if payload.nbytes != size or _checksum(payload) != checksum:
            return None
        return payload.copy()  # writable, and free of the file's bytes object

    def _rebuild(self) -> None:
        """The index from the folder: well-formed files, oldest first; anything else is deleted."""
        entries = []
        for path in self.folder.iterdir():
            name = _name_of(path)
            try:
                if name is None or path.stat().st_size != self.file_bytes:
                    raise ValueError
                with path.open("rb") as stream:
                    if self._check(stream.read(HEADER_BYTES), name, full=False) is None:
                        raise ValueError
                entries.append((path.stat().st_mtime_ns, name))
            except (OSError, ValueError):
                self.rejected += 1
                with contextlib.suppress(OSError):
                    path.unlink()
        for _, name in sorted(entries):
            self._index[name] = None
            self.bytes_used += self.file_bytes
        while self.bytes_used > self.capacity_bytes:
            self._remove(next(iter(self._index)))

    def _reject(self, name: bytes) -> None:
        log.warning("KV disk tier: %s failed its checks and was deleted", self.path(name))
        self.rejected += 1
        self._remove(name)

    def _remove(self, name: bytes) -> None:
        with contextlib.suppress(OSError):
            self.path(name).unlink()
        self._forget(name)

    def _forget(self, name: bytes) -> None:
        if name in self._index:
            del self._index[name]
            self.bytes_used -= self.file_bytes


def _name_of(path: Path) -> bytes | None:
    if path.suffix != SUFFIX or not path.is_file():
        return None
    try:
        name = bytes.fromhex(path.stem)
    except ValueError:
        return None
    return name if len(name) == 16 else None


def _checksum(data: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(data), digest_size=16).digest()

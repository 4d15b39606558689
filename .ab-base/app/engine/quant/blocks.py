"""The base of the numpy reference formats: `BlockFormat` (a format registers itself under its table
name by subclassing it) and the byte helpers every format's block math shares. reference.py and
lowbit.py both build on it, so neither imports the other's half."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from app.engine.quant.types import QUANT_TYPES, QuantType

_FORMATS: dict[str, BlockFormat] = {}
_DECODE_CHUNK_VALUES = 1 << 18  # bounds the temporaries of one decode pass (~1 MiB each)


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 field at `offset` of every block, as float32 of shape (n, 1)."""
    return blocks[:, offset : offset + 2].view(np.float16).astype(np.float32)


def _set_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[:, offset : offset + 2].view(np.float16)[:, 0] = values


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """ggml's 4-bit packing: byte j holds value j (low nibble) and value j + len (high nibble)."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _bits(packed: np.ndarray, n_bits: int) -> np.ndarray:
    """Little-endian bit `j` of the packed bytes, for j in range(n_bits), as uint8 0/1."""
    return np.unpackbits(packed, axis=-1, count=n_bits, bitorder="little")


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-block scale factors in [0.5, 1.5): blocks differ, none is degenerate."""
    return rng.random(n, dtype=np.float32) + np.float32(0.5)


def _repeat_with_keys(pool: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """`n` items: `pool`, then copies of it each XOR-ed with the next key (one key per copy)."""
    if n <= len(pool):
        return pool[:n].copy()
    out = np.empty(n, dtype=pool.dtype)
    out[: len(pool)] = pool
    for key, start in zip(keys, range(len(pool), n, len(pool)), strict=False):
        stop = min(start + len(pool), n)
        np.bitwise_xor(pool[: stop - start], key, out=out[start:stop])
    return out


def _random_bytes(rng: np.random.Generator, n_bytes: int, pool_words: int = 1 << 20) -> np.ndarray:
    """`n_bytes` random bytes at memory speed.

    The first 8 MiB come from the generator; each further 8 MiB repeats them XOR-ed with a
    fresh random 64-bit key. Random enough for test and benchmark weights, and several
    times faster than drawing every byte, which matters for random 8B checkpoints.
    """
    words = -(-n_bytes // 8)
    pool = rng.bit_generator.random_raw(min(words, pool_words))
    keys = rng.bit_generator.random_raw(-(-words // pool_words))
    return _repeat_with_keys(pool, words, keys).view(np.uint8)[:n_bytes]


class BlockFormat:
    """One quantization format: its block math in numpy, registered under its table name."""

    qtype: ClassVar[QuantType]

    def __init_subclass__(cls, name: str, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.qtype = QUANT_TYPES[name]
        _FORMATS[name] = cls()

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        """(n_blocks, type_size) uint8 -> (n_blocks, block_size) float32."""
        raise NotImplementedError

    def random_blocks(self, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
        """Random bytes with every fp16 scale field overwritten by a finite, sensible value."""
        blocks = _random_bytes(rng, n_blocks * self.qtype.type_size).reshape(n_blocks, self.qtype.type_size)
        self.set_scales(blocks, rng, scale)
        return blocks

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        raise NotImplementedError

"""FP8 (e4m3fn) KV cache for the numpy backend: the codec, scales and the cache layout.

Element format: OCP FP8 E4M3 "fn" (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
infinities, the largest finite value is 448, 0x7F/0xFF are NaN), the format vLLM and the
H100/H200 tensor cores use. Rounding is to nearest, ties to even; values beyond 448 saturate.

Scales: one float32 per (block, KV head), a power of two chosen so the block's largest
|value| fits in 448. A write that brings a larger value into a block raises that block's
scale and re-encodes the values already in it; since the factor is a power of two that
re-encoding is exact except where values fall into the subnormal range. A write that covers
a block's first slot starts the block afresh (tokens are written in order, so slot 0 is
written first). Stored value = fp8(x / scale); read value = decode(byte) * scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

FP8_MAX = 448.0
_MIN_NORMAL_EXP = -6  # 2**-6: the smallest normal e4m3 value; below it the spacing is 2**-9


def _decode_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    mant = codes & 0x7
    normal = (1.0 + mant / 8.0) * np.exp2(exp - 7.0)
    subnormal = mant / 8.0 * 2.0**-6
    values = sign * np.where(exp == 0, subnormal, normal)
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


E4M3_VALUES = _decode_table()  # byte -> float32


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[codes]


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bytes, round to nearest even, saturating at +-448 (NaN stays NaN)."""
    x = np.asarray(x, dtype=np.float32)
    sign = np.signbit(x).astype(np.uint8) << 7
    mag = np.minimum(np.abs(x), np.float32(FP8_MAX))
    _, exp = np.frexp(mag)  # mag = m * 2**exp with m in [0.5, 1): the leading bit is 2**(exp - 1)
    lead = np.maximum(exp - 1, _MIN_NORMAL_EXP)
    quantum = np.exp2(lead - 3).astype(np.float32)  # 3 mantissa bits below the leading one
    steps = np.rint(mag / quantum)  # ties to even; an exact multiple, so no double rounding
    q = steps * quantum  # may round up into the next binade: encoded from q itself below
    _, qexp = np.frexp(q)
    qlead = np.maximum(qexp - 1, _MIN_NORMAL_EXP)
    is_normal = q >= np.float32(2.0**_MIN_NORMAL_EXP)
    exp_field = np.where(is_normal, qlead + 7, 0)
    mant_field = np.where(is_normal, q / np.exp2(qlead) * 8 - 8, q / np.float32(2.0**-9))
    codes = (exp_field.astype(np.int64) << 3) | np.rint(mant_field).astype(np.int64)
    codes = np.where(np.isnan(x), 0x7F, codes).astype(np.uint8)
    return codes | sign


def pow2_scale(amax: np.ndarray) -> np.ndarray:
    """The smallest power of two s with amax / s <= 448 (0 where amax is 0: an empty block)."""
    amax = np.asarray(amax, dtype=np.float32)
    # Exact, from the exponent (no log2 rounding at a binade's edge): amax = m * 2**e with m in
    # [0.5, 1) fits under 448 = 0.875 * 2**9 times 2**(e - 9) when m <= 0.875, else 2**(e - 8).
    # The CUDA writer (kernels/csrc/fp8_kv.cuh, e4m3_block_scale) computes the same.
    mant, exp = np.frexp(np.where(amax > 0, amax, np.float32(1.0)))
    k = np.where(mant <= np.float32(0.875), exp - 9, exp - 8)
    scale = np.ldexp(np.float32(1.0), k).astype(np.float32)
    return np.where(amax > 0, scale, np.float32(0.0))


@dataclass
class Fp8KvCache:
    """One layer's K (or V) cache in FP8: `data [num_blocks, block_size, n_kv_heads, head_dim]`
    e4m3 bytes and `scale [num_blocks, n_kv_heads]` float32. The CUDA backend holds the same layout
    in device arrays (kernels/csrc/fp8_kv.cuh); `write` and `read` are the numpy backend's (CUDA's
    kernels do both on the device)."""

    data: np.ndarray
    scale: np.ndarray

    @classmethod
    def zeros(cls, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, xp: Any = np) -> Fp8KvCache:
        """An empty cache in `xp`'s arrays (numpy, or CuPy for the CUDA backend)."""
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        return cls(xp.zeros(shape, xp.uint8), xp.zeros((num_blocks, n_kv_heads), xp.float32))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def leaves(self) -> tuple[np.ndarray, np.ndarray]:
        """The arrays that hold a block (leading axis: block id), for the offload copies."""
        return self.data, self.scale

    def write(self, x: np.ndarray, slot_mapping: np.ndarray) -> None:
        """Store `x [T, n_kv_heads, head_dim]` at its slots, raising block scales where needed."""
        block_size = self.data.shape[1]
        blocks, offsets = np.divmod(np.asarray(slot_mapping, dtype=np.int64), block_size)
        self.scale[np.unique(blocks[offsets == 0])] = 0.0  # those blocks start afresh
        touched, inverse = np.unique(blocks, return_inverse=True)
        amax = np.zeros((len(touched), x.shape[1]), np.float32)
        np.maximum.at(amax, inverse, np.abs(x).max(axis=-1))
        old = self.scale[touched]
        new = np.maximum(old, pow2_scale(amax))
        grow_b, grow_h = np.nonzero((new > old) & (old > 0))
        if len(grow_b):  # re-encode what those blocks already hold at the larger scale
            b, h = touched[grow_b], grow_h
            values = decode_e4m3(self.data[b, :, h, :]) * (old[grow_b, grow_h] / new[grow_b, grow_h])[:, None, None]
            self.data[b, :, h, :] = encode_e4m3(values)
        self.scale[touched] = new
        scales = self.scale[blocks][:, :, None]  # [T, n_kv, 1]
        safe = np.where(scales > 0, scales, np.float32(1.0))
        self.data[blocks, offsets] = encode_e4m3(x / safe)

    def read(self, block_ids: np.ndarray) -> np.ndarray:
        """The blocks' values, dequantized: `[len(block_ids), block_size, n_kv_heads, head_dim]` float32."""
        ids = np.asarray(block_ids, dtype=np.int64)
        return decode_e4m3(self.data[ids]) * self.scale[ids][:, None, :, None]


def kv_block_bytes_fp8(block_size: int, n_kv_heads: int, head_dim: int) -> int:
    """Bytes one block of one layer's K (or V) takes in FP8, its scales counted."""
    return block_size * n_kv_heads * head_dim + 4 * n_kv_heads

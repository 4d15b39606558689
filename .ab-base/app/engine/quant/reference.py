"""numpy dequantizers, one class per format: the oracle the CUDA kernels are tested against.

Each format writes only its per-block math on an `(n_blocks, type_size)` uint8 array,
fully vectorised, and how to make valid random blocks of itself. Layouts follow ggml's
block structs (`block_q4_0`, `block_q4_K`, ...); the byte offsets below read off
`types.py`'s table. Arithmetic follows ggml's order of operations (e.g. `d * sc` first,
then `* q - dmin * m`) so results equal ggml's and gguf-py's bit for bit.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

# the table-lookup formats (lowbit.py) register themselves on import, beside the ones below
from app.engine.quant import lowbit as _lowbit  # noqa: F401
from app.engine.quant.blocks import (
    _DECODE_CHUNK_VALUES,
    _FORMATS,
    BlockFormat,
    _bits,
    _f16,
    _jitter,
    _nibbles,
    _repeat_with_keys,
    _set_f16,
)
from app.engine.quant.types import QK_K, QuantType


class _Float(BlockFormat, name="F32"):
    """Plain floats: a 'block' is one value; bytes are little-endian IEEE."""

    dtype: ClassVar[str] = "<f4"
    low_mantissa_mask: ClassVar[int] = 0xFFFF

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        return blocks.view(self.dtype).astype(np.float32)

    def encode(self, values: np.ndarray) -> np.ndarray:
        return values.astype(self.dtype).view(np.uint8)

    def random_blocks(self, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
        # Encoding every value is slow (fp16/bf16 rounding), so encode 1M normals once and repeat
        # them with random sign flips and low-mantissa noise: still normal, still finite.
        width = self.qtype.type_size
        normals = rng.standard_normal(min(n_blocks, 1 << 20), dtype=np.float32) * np.float32(scale)
        pool = self.encode(normals).view(f"<u{width}")
        sign_and_low_bits = (1 << (8 * width - 1)) | self.low_mantissa_mask
        keys = rng.bit_generator.random_raw(-(-n_blocks // max(len(pool), 1)))
        keys = (keys & sign_and_low_bits).astype(pool.dtype)
        return _repeat_with_keys(pool, n_blocks, keys).view(np.uint8).reshape(n_blocks, width)


class _F16(_Float, name="F16"):
    dtype = "<f2"
    low_mantissa_mask = 0x7


class _BF16(_Float, name="BF16"):
    """The top 16 bits of a float32."""

    low_mantissa_mask = 0x1

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        return (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)

    def encode(self, values: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(values, dtype="<f4").view(np.uint32)
        # Round to nearest even, as ggml's fp32->bf16; NaNs stay NaN (forced quiet) instead of rounding to inf.
        rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
        quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)
        return np.where(is_nan, quiet_nan, rounded).astype("<u2").view(np.uint8)


class _Q8_0(BlockFormat, name="Q8_0"):
    """d (fp16), 32 x int8: w = d * q."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        return _f16(blocks, 0) * blocks[:, 2:].view(np.int8).astype(np.float32)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 64 * _jitter(rng, len(blocks)))


class _Q4_0(BlockFormat, name="Q4_0"):
    """d, 16 bytes of nibbles: w = d * (q - 8)."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        q = _nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
        return _f16(blocks, 0) * q.astype(np.float32)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 4 * _jitter(rng, len(blocks)))


class _Q4_1(BlockFormat, name="Q4_1"):
    """d, m, 16 bytes of nibbles: w = d * q + m."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        q = _nibbles(blocks[:, 4:]).astype(np.float32)
        return _f16(blocks, 0) * q + _f16(blocks, 2)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        d = scale / 4 * _jitter(rng, len(blocks))
        _set_f16(blocks, 0, d)
        _set_f16(blocks, 2, -7.5 * d * _jitter(rng, len(blocks)))  # roughly centres q in 0..15


class _Q5_0(BlockFormat, name="Q5_0"):
    """d, 32 high bits (uint32), 16 bytes of nibbles: w = d * ((q | h << 4) - 16)."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        q = _nibbles(blocks[:, 6:]) | (_bits(blocks[:, 2:6], 32) << 4)
        return _f16(blocks, 0) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 8 * _jitter(rng, len(blocks)))


class _Q5_1(BlockFormat, name="Q5_1"):
    """d, m, 32 high bits, 16 bytes of nibbles: w = d * (q | h << 4) + m."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        q = _nibbles(blocks[:, 8:]) | (_bits(blocks[:, 4:8], 32) << 4)
        return _f16(blocks, 0) * q.astype(np.float32) + _f16(blocks, 2)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        d = scale / 8 * _jitter(rng, len(blocks))
        _set_f16(blocks, 0, d)
        _set_f16(blocks, 2, -15.5 * d * _jitter(rng, len(blocks)))


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 bytes of eight 6-bit scales and eight 6-bit mins of Q4_K/Q5_K.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the
    same for mins; bytes 8-11 the low 4 bits of scale 4+j (low nibble) and min 4+j (high).
    """
    sc_lo, mn_lo, extra = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([sc_lo & 0x3F, (extra & 0x0F) | ((sc_lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([mn_lo & 0x3F, (extra >> 4) | ((mn_lo >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_quant_decode(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """w = (d * scale_s) * q - dmin * min_s over 8 sub-blocks of 32; q is (n, 8, 32) float32."""
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    d = (_f16(blocks, 0) * scales)[:, :, None]
    dm = (_f16(blocks, 2) * mins)[:, :, None]
    return (d * q - dm).reshape(len(blocks), QK_K)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K packing: each 32-byte group j gives sub-block 2j (low nibbles) and 2j+1 (high)."""
    groups = qs.reshape(len(qs), 4, 1, 32)
    return np.concatenate([groups & 0x0F, groups >> 4], axis=2).reshape(len(qs), 8, 32)


class _Q4_K(BlockFormat, name="Q4_K"):
    """d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles; 8 sub-blocks of 32."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        return _k_quant_decode(blocks, _k_nibbles(blocks[:, 16:]).astype(np.float32))

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 236 * _jitter(rng, len(blocks)))  # mean scale * q ~ 31.5 * 7.5
        _set_f16(blocks, 2, scale / 32 * _jitter(rng, len(blocks)))


class _Q5_K(BlockFormat, name="Q5_K"):
    """As Q4_K plus 32 bytes of fifth bits: bit s of byte l is the high bit of value l of sub-block s."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        high = _bits(blocks[:, 16:48, None], 8).transpose(0, 2, 1)  # (n, sub-block, l)
        q = _k_nibbles(blocks[:, 48:]) | (high << 4)
        return _k_quant_decode(blocks, q.astype(np.float32))

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 488 * _jitter(rng, len(blocks)))  # mean scale * q ~ 31.5 * 15.5
        _set_f16(blocks, 2, scale / 32 * _jitter(rng, len(blocks)))


class _Q6_K(BlockFormat, name="Q6_K"):
    """128 bytes low nibbles, 64 bytes 2-bit highs, 16 int8 scales, d; 16 sub-blocks of 16.

    Each half of 128 values uses 64 low bytes and 32 high bytes: values 0-31 take the low
    nibbles of bytes 0-31, 32-63 of bytes 32-63, 64-95 and 96-127 their high nibbles; the
    2-bit pairs of high byte l (bits 0-1, 2-3, 4-5, 6-7) go to values l, l+32, l+64, l+96.
    """

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        n = len(blocks)
        low = blocks[:, :128].reshape(n, 2, 64)
        low = np.concatenate([low & 0x0F, low >> 4], axis=-1).reshape(n, 2, 4, 32)
        high = blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
        q = (low | ((high & 0x03) << 4)).astype(np.int8) - np.int8(32)
        d = _f16(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
        return (d[:, :, None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 208, scale / 1024 * _jitter(rng, len(blocks)))  # mean |scale| 64 * |q| 16


def block_format(qtype: QuantType) -> BlockFormat:
    try:
        return _FORMATS[qtype.name]
    except KeyError:
        raise ValueError(f"no numpy reference for {qtype.name}. Supported: {', '.join(_FORMATS)}") from None


def dequantize(data: np.ndarray, qtype: QuantType) -> np.ndarray:
    """float32 values of uint8 `data` whose last axis is a whole number of `qtype` blocks.

    Returns a new array of shape `(*data.shape[:-1], n_values)`.
    """
    if data.dtype != np.uint8 or data.ndim == 0 or data.shape[-1] % qtype.type_size:
        raise ValueError(
            f"{qtype.name}: expected uint8 data whose last axis is a multiple of {qtype.type_size} bytes, "
            f"got {data.dtype} {data.shape}"
        )
    fmt = block_format(qtype)
    blocks = data.reshape(-1, qtype.type_size)
    out = np.empty((len(blocks), qtype.block_size), dtype=np.float32)
    chunk = max(1, _DECODE_CHUNK_VALUES // qtype.block_size)
    for start in range(0, len(blocks), chunk):
        stop = start + chunk
        out[start:stop] = fmt.decode(blocks[start:stop])
    n_values = data.shape[-1] // qtype.type_size * qtype.block_size
    return out.reshape(*data.shape[:-1], n_values)


def encode_float(values: np.ndarray, qtype: QuantType) -> np.ndarray:
    """F32/F16/BF16 bytes of `values`: uint8 of shape `(*values.shape[:-1], n * bytes_per_value)`."""
    fmt = block_format(qtype)
    if not isinstance(fmt, _Float):
        raise ValueError(f"encode_float: {qtype.name} is not a float format (F32, F16, BF16)")
    values = np.asarray(values)
    if values.ndim == 0:
        values = values.reshape(1)
    return fmt.encode(values).reshape(*values.shape[:-1], -1)


def random_blocks(
    qtype: QuantType, n_blocks: int, rng: np.random.Generator, scale: float = 0.05
) -> np.ndarray:
    """`(n_blocks, type_size)` uint8 of valid blocks whose decoded weights are about `scale` in size."""
    if n_blocks < 0 or not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"random_blocks: need n_blocks >= 0 and a finite scale > 0, got {n_blocks}, {scale}")
    return block_format(qtype).random_blocks(n_blocks, rng, scale)


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """ggml's reference Q8_0 quantizer: per 32 values d = max|x| / 127, q = round-half-away(x / d).

    `values` (..., n) with n a multiple of 32 -> uint8 (..., n // 32 * 34).
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % 32:
        raise ValueError(f"quantize_q8_0: last axis must be a multiple of 32, got shape {values.shape}")
    groups = values.reshape(-1, 32)
    d = np.abs(groups).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d)
    scaled = groups * inv_d
    truncated = np.trunc(scaled)
    is_tie = np.abs(scaled - truncated) == 0.5  # C's roundf rounds ties away from zero, np.rint to even
    q = np.where(is_tie, truncated + np.sign(scaled), np.rint(scaled)).astype(np.int8)
    blocks = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=-1)
    return blocks.reshape(*values.shape[:-1], -1)

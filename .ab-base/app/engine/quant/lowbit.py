"""numpy dequantizers of GGUF's table-lookup 4-bit formats: MXFP4, NVFP4, IQ4_NL and IQ4_XS.

Each nibble indexes a 16-entry table of small integers that is scaled per block. Layouts
follow ggml's `block_mxfp4`, `block_iq4_nl` and `block_iq4_xs`: in every 32-weight group the
low nibbles of 16 bytes are weights 0..15 and the high nibbles weights 16..31 (`block_nvfp4`:
the same per 16 weights and 8 bytes). The
arithmetic is ggml's (`d * table[q]` in float32), so results equal gguf-py's bit for bit.
Registered with the format table (blocks.py) on import; reference.py imports this module.
"""

from __future__ import annotations

import numpy as np

from app.engine.quant.blocks import BlockFormat, _f16, _jitter, _set_f16
from app.engine.quant.types import QK_K

# e2m1 values doubled, so that each is an integer; the e8m0 scale is halved to match (ggml's
# kvalues_mxfp4 and ggml_e8m0_to_fp32_half).
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
# ggml's kvalues_iq4nl: a non-uniform grid fitted to normally distributed weights.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def e8m0_half(exponents: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32 for uint8 e: half the e8m0 scale 2^(e - 127). e = 0 and 1 give the
    subnormals 2^-128 and 2^-127; e = 255 (NaN in the OCP spec) gives 2^127, as ggml does."""
    e = exponents.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _group_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, g * 16) bytes -> (n, g, 32) nibble indices: low nibbles first, then high, per 16 bytes."""
    groups = qs.reshape(len(qs), -1, 16)
    return np.concatenate([groups & 0x0F, groups >> 4], axis=-1)


class _MXFP4(BlockFormat, name="MXFP4"):
    """e (e8m0), 16 bytes of e2m1 nibbles: w = 2^(e - 128) * doubled_e2m1[q]."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        d = e8m0_half(blocks[:, 0:1])
        return d * E2M1_DOUBLED[_group_nibbles(blocks[:, 1:])[:, 0]]

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        # Mean |doubled e2m1| is 4.7: exponents around scale / 4.7, one step either way.
        centre = 128 + int(np.round(np.log2(scale / 4.7)))
        blocks[:, 0] = np.clip(centre + rng.integers(-1, 2, len(blocks)), 2, 254).astype(np.uint8)


def ue4m3_half(codes: np.ndarray) -> np.ndarray:
    """Half the value of unsigned e4m3 scale bytes (ggml's ue4m3_to_fp32 for NVFP4): the sign bit is
    ignored, so exponent 15 / mantissa 7 is 480 rather than e4m3fn's NaN; only 0 and 0x7F itself give 0."""
    from app.engine.quant.split import E4M3FN

    table = E4M3FN[:128].copy()
    table[0x7F] = 480.0
    half = table[codes & np.uint8(0x7F)] * np.float32(0.5)
    return np.where(codes == 0x7F, np.float32(0), half).astype(np.float32)


class _NVFP4(BlockFormat, name="NVFP4"):
    """4 ue4m3 scales, 4 x 8 bytes of e2m1 nibbles; 4 sub-blocks of 16: w = ue4m3 / 2 * doubled_e2m1[q]."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        d = ue4m3_half(blocks[:, 0:4])[:, :, None]
        qs = blocks[:, 4:].reshape(len(blocks), 4, 8)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        return (d * E2M1_DOUBLED[q]).reshape(len(blocks), 64)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        from app.engine.quant.split import encode_e4m3

        target = scale / 2.25 * (0.75 + 0.5 * rng.random((len(blocks), 4), dtype=np.float32))
        blocks[:, 0:4] = np.minimum(encode_e4m3(target), 0x7E)  # mean |e2m1| is 2.25


class _IQ4_NL(BlockFormat, name="IQ4_NL"):
    """d (fp16), 16 bytes of nibbles: w = d * kvalues_iq4nl[q]."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        return _f16(blocks, 0) * IQ4_VALUES[_group_nibbles(blocks[:, 2:])[:, 0]]

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 55 * _jitter(rng, len(blocks)))  # mean |kvalue| ~ 55


def iq4_xs_scales(blocks: np.ndarray) -> np.ndarray:
    """The eight signed 6-bit sub-block scales of IQ4_XS blocks, (n, 8) float32.

    Sub-block s takes its low 4 bits from nibble s of scales_l (bytes 4..7, low nibble first)
    and its high 2 bits from bits 2s..2s+1 of scales_h (uint16 at byte 2); the value is less 32.
    """
    low = np.concatenate([blocks[:, 4:8, None] & 0x0F, blocks[:, 4:8, None] >> 4], axis=-1).reshape(-1, 8)
    high = blocks[:, 2:4].view("<u2") >> (2 * np.arange(8, dtype=np.uint16))
    ls = low.astype(np.int16) | ((high & 3).astype(np.int16) << 4)
    return (ls - 32).astype(np.float32)


class _IQ4_XS(BlockFormat, name="IQ4_XS"):
    """d (fp16), scales_h (u16), scales_l[4], 128 bytes of nibbles; 8 sub-blocks of 32:
    w = (d * scale_s) * kvalues_iq4nl[q]."""

    def decode(self, blocks: np.ndarray) -> np.ndarray:
        dl = (_f16(blocks, 0) * iq4_xs_scales(blocks))[:, :, None]
        return (dl * IQ4_VALUES[_group_nibbles(blocks[:, 8:])]).reshape(len(blocks), QK_K)

    def set_scales(self, blocks: np.ndarray, rng: np.random.Generator, scale: float) -> None:
        _set_f16(blocks, 0, scale / 880 * _jitter(rng, len(blocks)))  # mean |scale| 16 * |kvalue| 55

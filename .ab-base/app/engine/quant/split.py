"""numpy dequantizers of the split formats: element codes in one tensor, scales in another.

Safetensors checkpoints keep a quantized matrix as two tensors: the codes (`weight`, or
GPT-OSS's `*_blocks`) and a grid of scales (`weight_scale_inv`, `weight_scale`, `*_scales`)
where scale `[i, j]` covers the rows `i * gr ..` and columns `j * gc ..` of one group
`(gr, gc)`: 128 x 128 for DeepSeek-style block FP8, `(1, cols)` per channel, `(rows, cols)`
per tensor, `(1, 16)` for NVFP4 and `(1, 32)` for MXFP4. NVFP4 adds one float32 global
scale (`weight_scale_2`). The weight is `code * (scale * global)` in float32.

Element codes, from their published definitions (tested against torch's float8 dtypes and
the OCP / NVIDIA format documents):
- float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal
  (m / 8 * 2^-6); 0x7F and 0xFF are NaN; there is no infinity.
- e2m1 (fp4): sign, 2 exponent bits (bias 1), 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  Two per byte, the low nibble first (element 2j in the low nibble of byte j).
- e8m0 (MX scales): 2^(e - 127); 0xFF is NaN.
"""

from __future__ import annotations

import numpy as np

from app.engine.quant.types import QuantType


def _e4m3fn_table() -> np.ndarray:
    code = np.arange(256)
    sign = np.where(code & 0x80, -1.0, 1.0)
    exp, man = (code >> 3) & 0x0F, code & 0x07
    magnitude = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    table = (sign * magnitude).astype(np.float32)
    table[(code & 0x7F) == 0x7F] = np.nan
    return table


def _e2m1_table() -> np.ndarray:
    code = np.arange(16)
    sign = np.where(code & 0x8, -1.0, 1.0)
    exp, man = (code >> 1) & 0x3, code & 0x1
    magnitude = np.where(exp == 0, man * 0.5, (1 + man / 2) * 2.0 ** (exp - 1))
    return (sign * magnitude).astype(np.float32)


def _e8m0_table() -> np.ndarray:
    table = np.ldexp(np.float32(1), np.arange(255) - 127).astype(np.float32)
    return np.append(table, np.float32(np.nan))


E4M3FN = _e4m3fn_table()  # float32 value of each float8_e4m3fn byte
E2M1 = _e2m1_table()  # float32 value of each fp4 nibble
E8M0 = _e8m0_table()  # float32 value of each e8m0 scale byte
E4M3_MAX = 448.0
E2M1_MAX = 6.0

SCALE_DTYPES = ("F32", "BF16", "F8_E4M3", "E8M0")  # how a grid's scales are stored


def scale_values(raw: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of a grid's stored scales (F32 floats, BF16 as uint16 bits, or uint8 codes)."""
    if dtype == "F32":
        return np.asarray(raw, dtype=np.float32)
    if dtype == "BF16":
        return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return E4M3FN[np.asarray(raw, dtype=np.uint8)]
    if dtype == "E8M0":
        return E8M0[np.asarray(raw, dtype=np.uint8)]
    raise ValueError(f"unknown scale dtype {dtype!r}. Supported: {', '.join(SCALE_DTYPES)}")


def code_values(codes: np.ndarray, qtype: QuantType) -> np.ndarray:
    """(rows, row_bytes) uint8 codes -> (rows, cols) float32 element values, before scaling."""
    if qtype.name == "FP8_E4M3":
        return E4M3FN[codes]
    if qtype.name in ("NVFP4_SPLIT", "MXFP4_SPLIT"):
        pairs = np.stack([codes & 0x0F, codes >> 4], axis=-1)  # low nibble is the even element
        return E2M1[pairs.reshape(len(codes), -1)]
    raise ValueError(f"{qtype.name} is not a split format")


def expand_scales(scales: np.ndarray, group: tuple[int, int], rows: np.ndarray, n_cols: int) -> np.ndarray:
    """The scale of every weight of the given rows: (len(rows), n_cols) float32."""
    gr, gc = group
    per_row = scales[rows // gr]
    return np.repeat(per_row, gc, axis=1)[:, :n_cols]


def dequantize_split(
    codes: np.ndarray,
    qtype: QuantType,
    scales: np.ndarray,
    group: tuple[int, int],
    global_scale: float,
    rows: np.ndarray,
) -> np.ndarray:
    """float32 weights of code rows `codes` (source rows `rows`): code * (scale * global)."""
    values = code_values(codes, qtype)
    factor = scales * np.float32(global_scale) if global_scale != 1.0 else scales
    return values * expand_scales(factor.astype(np.float32), group, rows, values.shape[1])


# -- encoders: random and quantized checkpoints for tests and benchmarks ------------------


def encode_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest float8_e4m3fn byte (ties to the even code), saturated to +-448."""
    return _nearest(np.clip(np.asarray(values, np.float32), -E4M3_MAX, E4M3_MAX), E4M3FN[:0x7F], 0x80)


def encode_e2m1(values: np.ndarray) -> np.ndarray:
    """float32 -> nearest e2m1 nibble (uint8 0..15), saturated to +-6."""
    return _nearest(np.clip(np.asarray(values, np.float32), -E2M1_MAX, E2M1_MAX), E2M1[:8], 0x8)


def _nearest(values: np.ndarray, positive: np.ndarray, sign_bit: int) -> np.ndarray:
    """The code of the nearest magnitude in the ascending `positive` table, plus the sign bit
    for negative values (so small negatives round to -0, as torch's conversion does)."""
    magnitude = np.abs(values)
    hi = np.clip(np.searchsorted(positive, magnitude), 1, len(positive) - 1)
    lo = hi - 1
    above, below = positive[hi] - magnitude, magnitude - positive[lo]
    code = np.where((above < below) | ((above == below) & (hi % 2 == 0)), hi, lo)
    return (code | np.where(np.signbit(values), sign_bit, 0)).astype(np.uint8)


def pack_nibbles(nibbles: np.ndarray) -> np.ndarray:
    """(rows, cols) nibbles -> (rows, cols // 2) bytes, element 2j in the low nibble of byte j."""
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)


def quantize_fp8(values: np.ndarray, group: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-group absmax FP8 of a float matrix: (e4m3 codes `(rows, cols)`, float32 scales `(sr, sc)`).

    Each group's scale is its max |w| / 448, so its largest weight takes the largest code; w = code * scale."""
    values = np.asarray(values, np.float32)
    rows, cols = values.shape
    gr, gc = group
    sr, sc = -(-rows // gr), -(-cols // gc)
    padded = np.zeros((sr * gr, sc * gc), np.float32)
    padded[:rows, :cols] = values
    amax = np.abs(padded.reshape(sr, gr, sc, gc)).max(axis=(1, 3))
    scales = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    codes = encode_e4m3(values / expand_scales(scales, group, np.arange(rows), cols))
    return codes, scales


def quantize_nvfp4(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """NVFP4 of a float matrix as ModelOpt stores it: (packed e2m1 `(rows, cols / 2)`, e4m3 scale
    codes `(rows, cols / 16)`, float32 global scale); the global scale is max |w| / (6 * 448)."""
    values = np.asarray(values, np.float32)
    rows, cols = values.shape
    amax = float(np.abs(values).max()) or 1.0
    global_scale = float(np.float32(amax / (E2M1_MAX * E4M3_MAX)))
    block_amax = np.abs(values.reshape(rows, cols // 16, 16)).max(axis=-1)
    scale_codes = encode_e4m3(block_amax / np.float32(E2M1_MAX) / np.float32(global_scale))
    scales = E4M3FN[scale_codes] * np.float32(global_scale)
    safe = np.where(scales > 0, scales, np.float32(1))
    nibbles = encode_e2m1(values / expand_scales(safe, (1, 16), np.arange(rows), cols))
    return pack_nibbles(nibbles), scale_codes, global_scale


def random_split(
    qtype: QuantType, rows: int, cols: int, rng: np.random.Generator, scale: float
) -> tuple[np.ndarray, np.ndarray, str, tuple[int, int], float]:
    """Random codes and a scale grid (codes, raw scales, scale dtype, group, global scale) whose
    weights are about `scale` in size, at memory speed: for benchmark checkpoints of many GiB.

    FP8 codes have exponent bit 3 cleared (|code| <= 1.875, never NaN; mean |code| ~ 0.35) under
    128 x 128 float32 blocks; NVFP4 has e4m3 scales per 16 under a 2^-8 global scale; MXFP4 e8m0
    scales per 32 (mean |e2m1| is 2.25)."""
    from app.engine.quant.blocks import _random_bytes

    n_bytes = rows * qtype.row_bytes(cols)
    codes = _random_bytes(rng, n_bytes).reshape(rows, -1)
    if qtype.name == "FP8_E4M3":
        np.bitwise_and(codes, 0xBF, out=codes)
        sr, sc = -(-rows // 128), -(-cols // 128)
        blocks = (scale / 0.35 * (0.75 + 0.5 * rng.random((sr, sc)))).astype(np.float32)
        return codes, blocks, "F32", (128, 128), 1.0
    if qtype.name == "NVFP4_SPLIT":
        global_scale = 2.0**-8
        block = scale / 2.25 / global_scale * (0.75 + 0.5 * rng.random((rows, cols // 16)))
        return codes, encode_e4m3(block.astype(np.float32)), "F8_E4M3", (1, 16), global_scale
    if qtype.name == "MXFP4_SPLIT":
        centre = 127 + int(np.round(np.log2(scale / 2.25)))
        exps = (centre + rng.integers(-1, 2, (rows, cols // 32))).astype(np.uint8)
        return codes, exps, "E8M0", (1, 32), 1.0
    raise ValueError(f"{qtype.name} is not a split format")

"""The split-format oracles (quant/split.py) against independent references.

FP8 e4m3fn: torch's float8_e4m3fn (byte values, rounding, block and channel dequantization),
stored in tests/fixtures/quant/split_formats.npz by tests/fixtures/make_quant_reference.py.
GPT-OSS MXFP4: transformers' convert_moe_packed_tensors (same fixture), and gguf-py's MXFP4
dequantizer on the same codes repacked into GGUF blocks. NVFP4: the published definition
(NVIDIA's NVFP4: e2m1 elements, one e4m3 scale per 16, one float32 tensor scale) worked by hand
below, and gguf-py's NVFP4 dequantizer on the codes repacked into GGUF's blocks.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from app.engine.quant.dispatch import QuantizedTensor, ScaleGrid
from app.engine.quant.split import E2M1, encode_e2m1, encode_e4m3, pack_nibbles
from app.engine.quant.types import QUANT_TYPES

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "quant" / "split_formats.npz"
FP8, NVFP4, MXFP4 = (QUANT_TYPES[n] for n in ("FP8_E4M3", "NVFP4_SPLIT", "MXFP4_SPLIT"))


@functools.cache
def ref(name: str) -> np.ndarray:
    with np.load(FIXTURE) as refs:
        return refs[name]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_e4m3fn_bytes_equal_torch() -> None:
    codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
    grid = ScaleGrid(np.ones((1, 1), np.float32), "F32", (1, 256))
    values = QuantizedTensor("t", FP8, (1, 256), codes, grid).dequantize()[0]
    expected = ref("e4m3fn_values")
    np.testing.assert_array_equal(np.isnan(values), np.isnan(expected))
    finite = ~np.isnan(expected)
    _bits_equal(values[finite], expected[finite])  # -0.0 included


def test_e4m3fn_rounding_equals_torch() -> None:
    np.testing.assert_array_equal(encode_e4m3(ref("e4m3fn_inputs")), ref("e4m3fn_codes"))


def test_fp8_block_scaled_equals_torch() -> None:
    codes = ref("fp8_block_codes")
    grid = ScaleGrid(ref("fp8_block_scale_inv"), "F32", (128, 128))
    tensor = QuantizedTensor("w", FP8, codes.shape, codes, grid)
    _bits_equal(tensor.dequantize(), ref("fp8_block_weight"))
    rows = np.array([299, 0, 128, 255, 256])  # rows of every block row, in any order
    _bits_equal(tensor.dequantize(rows=rows), ref("fp8_block_weight")[rows])


def test_fp8_per_channel_and_per_tensor_equal_torch() -> None:
    codes = ref("fp8_channel_codes")
    rows, cols = codes.shape
    channel = QuantizedTensor(
        "w", FP8, codes.shape, codes, ScaleGrid(ref("fp8_channel_scale"), "F32", (1, cols))
    )
    _bits_equal(channel.dequantize(), ref("fp8_channel_weight"))
    # Per tensor: one scale for every weight, i.e. torch's values times that scale.
    scale = np.float32(0.0123)
    whole = QuantizedTensor(
        "w", FP8, codes.shape, codes, ScaleGrid(np.full((1, 1), scale), "F32", (rows, cols))
    )
    expected = ref("e4m3fn_values")[codes] * scale
    _bits_equal(whole.dequantize(), expected)


def test_fp8_bf16_scales_are_the_top_half_of_float32() -> None:
    codes = np.full((2, 4), 0x38, np.uint8)  # 1.0
    bf16 = np.array([[0x3F80], [0xC040]], np.uint16)  # 1.0, -3.0
    tensor = QuantizedTensor("w", FP8, (2, 4), codes, ScaleGrid(bf16, "BF16", (1, 4)))
    np.testing.assert_array_equal(tensor.dequantize(), [[1.0] * 4, [-3.0] * 4])


def _gpt_oss_tensor() -> QuantizedTensor:
    blocks, scales = ref("mxfp4_blocks"), ref("mxfp4_scales")
    experts, out_rows, groups, _ = blocks.shape
    codes = blocks.reshape(experts * out_rows, groups * 16)
    grid = ScaleGrid(scales.reshape(experts * out_rows, groups), "E8M0", (1, 32))
    return QuantizedTensor("experts", MXFP4, (experts, out_rows, groups * 32), codes, grid)


def test_gpt_oss_mxfp4_equals_transformers() -> None:
    _bits_equal(_gpt_oss_tensor().dequantize(), ref("mxfp4_weight"))


def test_gpt_oss_mxfp4_equals_gguf_mxfp4_blocks() -> None:
    tensor = _gpt_oss_tensor()
    # GGUF's block: the e8m0 byte, then elements 0..15 in low nibbles and 16..31 in high nibbles.
    nibbles = np.stack([tensor.data & 0x0F, tensor.data >> 4], axis=-1).reshape(-1, 32)
    gguf_blocks = np.concatenate(
        [tensor.scales.raw.reshape(-1, 1), nibbles[:, :16] | (nibbles[:, 16:] << 4)], axis=1
    ).astype(np.uint8)
    expected = gguf_dequantize(gguf_blocks.reshape(tensor.n_rows, -1), GGMLQuantizationType.MXFP4)
    _equal_but_zero_sign(tensor.dequantize().reshape(tensor.n_rows, -1), expected.astype(np.float32))


def _equal_but_zero_sign(ours: np.ndarray, gguf: np.ndarray) -> None:
    # ggml's integer e2m1 table has no -0 (code 8 is 0); the format's -0 is ours and transformers'.
    assert ours.shape == gguf.shape
    _bits_equal(np.where(ours == 0, np.float32(0), ours), gguf)


def test_nvfp4_worked_example() -> None:
    # One row of 32 weights: two blocks of 16, each with an e4m3 scale, and a float32 tensor scale.
    # Byte 0 = 0x2B: low nibble 0xB = 1|01|1 -> -(1 + 1/2) * 2^(1-1) = -1.5 (weight 0);
    #                high nibble 0x2 = 0|01|0 -> 1.0 (weight 1).
    # Byte 1 = 0x7F: low 0xF = 1|11|1 -> -6.0 (weight 2); high 0x7 = 0|11|1 -> 6.0 (weight 3).
    # Byte 2 = 0x91: low 0x1 = 0|00|1 -> subnormal 0.5 (weight 4); high 0x9 -> -0.5 (weight 5).
    # Scale of block 0: 0x38 = 0|0111|000 -> 2^(7-7) = 1.0; block 1: 0x44 = 0|1000|100 -> 1.5 * 2 = 3.0.
    # Tensor scale (weight_scale_2) 0.25: w = e2m1 * (e4m3 * 0.25).
    codes = np.zeros((1, 16), np.uint8)
    codes[0, :3] = [0x2B, 0x7F, 0x91]
    codes[0, 8] = 0x0C  # weight 16: 0xC = 1|10|0 -> -2.0; weight 17: 0
    grid = ScaleGrid(np.array([[0x38, 0x44]], np.uint8), "F8_E4M3", (1, 16), global_scale=0.25)
    w = QuantizedTensor("w", NVFP4, (1, 32), codes, grid).dequantize()[0]
    np.testing.assert_array_equal(w[:6], [-1.5 * 0.25, 1.0 * 0.25, -6.0 * 0.25, 6.0 * 0.25, 0.125, -0.125])
    assert np.all(w[6:16] == 0)
    np.testing.assert_array_equal(w[16:18], [-2.0 * 3.0 * 0.25, 0.0])


def test_nvfp4_equals_gguf_nvfp4_blocks() -> None:
    # gguf-py's NVFP4 block (64 weights): 4 ue4m3 scales, then per 16 weights 8 bytes, elements
    # 0..7 in low nibbles and 8..15 in high. With a tensor scale of 1 both formats mean the same.
    rng = np.random.default_rng(4)
    rows, cols = 5, 128
    nibbles = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    scales = rng.integers(0x20, 0x50, (rows, cols // 16), dtype=np.uint8)
    tensor = QuantizedTensor(
        "w", NVFP4, (rows, cols), pack_nibbles(nibbles), ScaleGrid(scales, "F8_E4M3", (1, 16))
    )
    sub = nibbles.reshape(-1, 4, 16)
    qs = (sub[..., :8] | (sub[..., 8:] << 4)).reshape(-1, 32)
    gguf_blocks = np.concatenate([scales.reshape(-1, 4), qs], axis=1).reshape(rows, -1)
    expected = gguf_dequantize(gguf_blocks, GGMLQuantizationType.NVFP4).astype(np.float32)
    _equal_but_zero_sign(tensor.dequantize(), expected)


def test_e2m1_table_and_encoder() -> None:
    np.testing.assert_array_equal(E2M1[:8], [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(E2M1[8:], -E2M1[:8])
    # Nearest value, ties to the even code (0.25 -> 0, 0.75 -> 1.0, 2.5 -> 2, 5 -> 4), saturating at 6.
    got = E2M1[encode_e2m1(np.array([0.25, 0.75, 1.25, 2.5, 5.0, -0.3, 9.0], np.float32))]
    np.testing.assert_array_equal(got, [0.0, 1.0, 1.0, 2.0, 4.0, -0.5, 6.0])


def test_bad_scale_grids_are_named() -> None:
    codes = np.zeros((4, 8), np.uint8)
    with pytest.raises(ValueError, match=r"'w'.*scales of shape \(1, 1\).*groups of 1 x 4"):
        QuantizedTensor("w", FP8, (4, 8), codes, ScaleGrid(np.ones((1, 1), np.float32), "F32", (1, 4)))
    with pytest.raises(ValueError, match="FP8_E4M3 needs scales"):
        QuantizedTensor("w", FP8, (4, 8), codes)
    with pytest.raises(ValueError, match="unknown scale dtype 'F64'"):
        QuantizedTensor("w", FP8, (4, 8), codes, ScaleGrid(np.ones((4, 1)), "F64", (1, 8))).dequantize()

"""The numpy dequantizers against gguf-py (llama.cpp's own Python package) as the independent reference."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from app.engine.loader.weights import Checkpoint
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.reference import dequantize, encode_float, quantize_q8_0, random_blocks
from app.engine.quant.types import QUANT_TYPES, QuantType, quant_type

ALL_TYPES = [q for q in QUANT_TYPES.values() if not q.split]  # GGUF types; split ones: test_quant_split.py
EMBEDDED_TYPES = ["Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"]


def _ids(qtype: QuantType) -> str:
    return qtype.name


def _reference(data: np.ndarray, qtype: QuantType) -> np.ndarray:
    return gguf_dequantize(data, GGMLQuantizationType[qtype.name])


def test_table_matches_ggml() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    for qtype in ALL_TYPES:
        ggml = GGMLQuantizationType[qtype.name]
        assert qtype.ggml_id == ggml.value
        assert (qtype.block_size, qtype.type_size) == GGML_QUANT_SIZES[ggml]


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids)
@pytest.mark.parametrize("n_blocks", [1, 3, 67])
def test_arbitrary_bytes_equal_gguf(qtype: QuantType, n_blocks: int) -> None:
    # Any bit pattern, NaN and inf scales included: the decoders must agree on all of them.
    rng = np.random.default_rng(n_blocks * 100 + qtype.ggml_id)
    data = rng.integers(0, 256, size=(2, n_blocks * qtype.type_size), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        ours = dequantize(data, qtype)
        expected = _reference(data, qtype)
    assert ours.dtype == np.float32
    assert ours.shape == (2, n_blocks * qtype.block_size)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids)
def test_random_blocks_equal_gguf_and_have_sensible_scale(qtype: QuantType) -> None:
    rng = np.random.default_rng(qtype.ggml_id)
    blocks = random_blocks(qtype, 4096 // qtype.block_size * 8, rng, scale=0.05)
    assert blocks.dtype == np.uint8 and blocks.shape == (4096 // qtype.block_size * 8, qtype.type_size)
    values = dequantize(blocks.reshape(8, -1), qtype)
    np.testing.assert_array_equal(values, _reference(blocks.reshape(8, -1), qtype))
    assert np.isfinite(values).all()
    assert 0.05 / 4 < np.abs(values).mean() < 0.05 * 4
    assert values.std() > 0.05 / 4


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids)
def test_random_blocks_beyond_the_random_pool(qtype: QuantType) -> None:
    # Past 8 MiB the generator repeats a random pool under new keys: the copies must still
    # be valid blocks, and must not equal the first copy.
    n_blocks = (9 << 20) // qtype.type_size
    blocks = random_blocks(qtype, n_blocks, np.random.default_rng(7), scale=0.5)
    values = dequantize(blocks, qtype)
    assert np.isfinite(values).all()
    half = n_blocks // 2
    assert not np.array_equal(values[:1000], values[half : half + 1000])
    np.testing.assert_array_equal(values[-300:], _reference(blocks[-300:], qtype).reshape(300, -1))


def test_random_blocks_deterministic_per_seed() -> None:
    qtype = QUANT_TYPES["Q4_K"]
    first = random_blocks(qtype, 10, np.random.default_rng(1))
    again = random_blocks(qtype, 10, np.random.default_rng(1))
    other = random_blocks(qtype, 10, np.random.default_rng(2))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize("name", EMBEDDED_TYPES)
def test_real_tensors_equal_gguf(embedded_checkpoint: Checkpoint, name: str) -> None:
    tensors = [t for t in embedded_checkpoint.tensors.values() if t.qtype.name == name]
    assert tensors, f"the embedded model has no {name} tensor"
    for tensor in tensors[:6]:
        rows = tensor.data[:48]  # a slice keeps the 262k-row embedding fast
        np.testing.assert_array_equal(dequantize(rows, tensor.qtype), _reference(rows, tensor.qtype))
    big = max(tensors, key=lambda t: t.nbytes)
    picked = np.random.default_rng(0).choice(
        big.data.shape[0], size=min(16, big.data.shape[0]), replace=False
    )
    np.testing.assert_array_equal(big.dequantize(picked), _reference(big.data[picked], big.qtype))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16"])
def test_real_weights_requantized_by_gguf(embedded_checkpoint: Checkpoint, name: str) -> None:
    # Formats the embedded file lacks: real weights, quantized by gguf-py's own quantizer.
    weights = embedded_checkpoint.tensors["blk.3.ffn_up.weight"].dequantize(slice(0, 32))
    ggml = GGMLQuantizationType[name]
    data = gguf_quantize(weights, ggml).view(np.uint8).reshape(32, -1)
    ours = dequantize(data, QUANT_TYPES[name])
    np.testing.assert_array_equal(ours, gguf_dequantize(data, ggml))
    assert np.abs(ours - weights).max() < 0.2 * np.abs(weights).max()


def test_quantized_tensor_dequantize_shapes(embedded_checkpoint: Checkpoint) -> None:
    norm = embedded_checkpoint.tensors["blk.0.attn_norm.weight"]
    assert norm.dequantize().shape == (640,)
    q = embedded_checkpoint.tensors["blk.0.attn_q.weight"]
    full = q.dequantize()
    assert full.shape == (1024, 640)
    np.testing.assert_array_equal(q.dequantize(slice(5, 9)), full[5:9])


SPECIAL_FLOATS = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        70000.0,
        1e-8,
        6e-5,
        np.inf,
        -np.inf,
        np.nan,
        3.14159,
        1.00390625,
        1.01171875,
    ],
    dtype=np.float32,
)


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_encode_float_equals_gguf(name: str) -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([SPECIAL_FLOATS, rng.standard_normal(3000).astype(np.float32) * 10])
    # Exact bf16 ties (low 16 bits 0x8000) check round-to-nearest-even.
    ties = (rng.integers(0, 1 << 15, 64).astype(np.uint32) << 16 | 0x8000).view(np.float32)
    values = np.concatenate([values, ties, -ties]).reshape(2, -1)
    ggml = GGMLQuantizationType[name]
    with np.errstate(over="ignore", invalid="ignore"):
        ours = encode_float(values, QUANT_TYPES[name])
        expected = gguf_quantize(values, ggml).view(np.uint8)
    assert ours.dtype == np.uint8 and ours.shape == (2, values.shape[1] * 2)
    np.testing.assert_array_equal(ours, expected.reshape(ours.shape))
    decoded = dequantize(ours, QUANT_TYPES[name])
    np.testing.assert_array_equal(decoded, gguf_dequantize(expected.reshape(ours.shape), ggml))


def test_encode_float_f32_is_exact_and_rejects_block_formats() -> None:
    values = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    raw = encode_float(values, QUANT_TYPES["F32"])
    np.testing.assert_array_equal(dequantize(raw, QUANT_TYPES["F32"]), values)
    with pytest.raises(ValueError, match="Q8_0 is not a float format"):
        encode_float(values, QUANT_TYPES["Q8_0"])


def test_quantize_q8_0_equals_gguf() -> None:
    rng = np.random.default_rng(5)
    values = rng.standard_normal((4, 256)).astype(np.float32)
    values[1, :32] = 0.0  # an all-zero block: d = 0
    # max|x| = 127 * 0.25 makes d = 0.25 exactly, so every other x / d is an exact tie k + 0.5,
    # which C's roundf takes away from zero (numpy's rint would take it to even).
    values[2, :32] = (np.arange(-16, 16) + 0.5) * 0.25
    values[2, 0] = 127 * 0.25
    ours = quantize_q8_0(values)
    expected = gguf_quantize(values, GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours, expected)
    error = np.abs(dequantize(ours, QUANT_TYPES["Q8_0"]) - values)
    assert error.max() <= np.abs(values).max() / 127


def test_from_float_round_trip() -> None:
    values = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    tensor = QuantizedTensor.from_float("w", values, QUANT_TYPES["BF16"])
    assert tensor.shape == (4, 8) and tensor.data.shape == (4, 16)
    expected = gguf_dequantize(gguf_quantize(values, GGMLQuantizationType.BF16), GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(tensor.dequantize(), expected)


def test_bad_input_is_named() -> None:
    q4k = QUANT_TYPES["Q4_K"]
    with pytest.raises(ValueError, match="multiple of 144 bytes"):
        dequantize(np.zeros((2, 100), np.uint8), q4k)
    with pytest.raises(ValueError, match="expected uint8"):
        dequantize(np.zeros((2, 144), np.float32), q4k)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(np.zeros(33, np.float32))
    with pytest.raises(ValueError, match="scale > 0"):
        random_blocks(q4k, 2, np.random.default_rng(), scale=0.0)
    with pytest.raises(ValueError, match="IQ2_XXS"):
        quant_type("IQ2_XXS")

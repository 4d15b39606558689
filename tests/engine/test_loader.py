"""Checkpoint loading: GGUF files written by gguf-py's own writer, HF folders written by the safetensors package."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize
from safetensors.numpy import save_file

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError, gguf_name
from app.engine.loader.weights import Checkpoint, describe_quantization, open_checkpoint
from app.engine.quant.reference import random_blocks
from app.engine.quant.types import QUANT_TYPES

# ---------------------------------------------------------------- GGUF


def _backed_by_mmap(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def _write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 500000.0)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float64("test.f64", 0.1)
    writer.add_int32("test.i32", -7)
    writer.add_int8("test.i8", -3)
    writer.add_uint64("test.u64", 2**40 + 1)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("test.text", "héllo ✓ 世界")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo", " 世界", "🙂"])
    writer.add_key_value(
        "tokenizer.ggml.scores", [0.0, -1.5, -2.5, 3.25, 0.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT32
    )
    writer.add_key_value(
        "tokenizer.ggml.token_type", [3, 3, 1, 1, 1], GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    writer.add_key_value("test.nested", [[1, 2], [3, 4, 5]], GGUFValueType.ARRAY)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _sample_tensors() -> dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]:
    rng = np.random.default_rng(0)
    q4k = random_blocks(QUANT_TYPES["Q4_K"], 3 * 2, rng).reshape(3, 2 * 144)
    q8 = random_blocks(QUANT_TYPES["Q8_0"], 4 * 2, rng).reshape(4, 2 * 34)
    bf16 = random_blocks(QUANT_TYPES["BF16"], 2 * 8, rng).reshape(2, 16)
    return {
        "output_norm.weight": (rng.standard_normal(16).astype(np.float32), None),
        "blk.0.f32_3d.weight": (rng.standard_normal((3, 5, 7)).astype(np.float32), None),
        "blk.0.attn_q.weight": (rng.standard_normal((4, 64)).astype(np.float16), None),
        "blk.0.ffn_down.weight": (q4k, GGMLQuantizationType.Q4_K),
        "blk.0.attn_v.weight": (q8, GGMLQuantizationType.Q8_0),
        "blk.1.attn_k.weight": (bf16, GGMLQuantizationType.BF16),
    }


@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    return _write_gguf(tmp_path / "small.gguf", _sample_tensors())


def test_gguf_tensors_are_views_in_numpy_order(small_gguf: Path) -> None:
    source = _sample_tensors()
    loaded = read_gguf(small_gguf)
    assert loaded.version == 3
    assert _backed_by_mmap(loaded.buffer)
    expected_shapes = {
        "output_norm.weight": ((16,), "F32", (1, 64)),
        "blk.0.f32_3d.weight": ((3, 5, 7), "F32", (15, 28)),
        "blk.0.attn_q.weight": ((4, 64), "F16", (4, 128)),
        "blk.0.ffn_down.weight": ((3, 512), "Q4_K", (3, 288)),
        "blk.0.attn_v.weight": ((4, 64), "Q8_0", (4, 68)),
        "blk.1.attn_k.weight": ((2, 8), "BF16", (2, 16)),
    }
    assert list(loaded.tensors) == list(expected_shapes)
    for name, (shape, type_name, data_shape) in expected_shapes.items():
        tensor = loaded.tensors[name]
        assert (tensor.shape, tensor.qtype.name, tensor.data.shape) == (shape, type_name, data_shape)
        assert np.shares_memory(tensor.data, loaded.buffer) and not tensor.data.flags.writeable
        array, raw_dtype = source[name]
        if raw_dtype is None:
            np.testing.assert_array_equal(tensor.dequantize(), array.astype(np.float32))
        else:
            np.testing.assert_array_equal(tensor.dequantize(), gguf_dequantize(array, raw_dtype))
            np.testing.assert_array_equal(tensor.data, array)


def test_gguf_metadata_values(small_gguf: Path) -> None:
    meta = read_gguf(small_gguf).metadata
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 2 and isinstance(meta["llama.block_count"], int)
    assert meta["llama.rope.freq_base"] == 500000.0
    assert meta["llama.attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5))
    assert meta["test.f64"] == 0.1
    assert (meta["test.i32"], meta["test.i8"], meta["test.u64"]) == (-7, -3, 2**40 + 1)
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["test.text"] == "héllo ✓ 世界"
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "</s>", "héllo", " 世界", "🙂"]
    assert meta["tokenizer.ggml.scores"] == [0.0, -1.5, -2.5, 3.25, 0.5]
    assert meta["tokenizer.ggml.token_type"] == [3, 3, 1, 1, 1]
    assert meta["test.nested"] == [[1, 2], [3, 4, 5]]
    json.dumps(meta)  # plain Python values only


def test_open_checkpoint_gguf(small_gguf: Path) -> None:
    checkpoint = open_checkpoint(small_gguf)
    assert (checkpoint.format, checkpoint.architecture, checkpoint.path) == ("gguf", "llama", small_gguf)
    assert checkpoint.hf_config is None and checkpoint.tokenizer_dir is None
    assert checkpoint.parameter_count == 16 + 105 + 256 + 1536 + 256 + 16
    assert checkpoint.quantization == "Q4_K_M (Q4_K, F16, F32, Q8_0, BF16)"
    assert open_checkpoint(small_gguf.parent).path == small_gguf  # a folder holding one .gguf


def test_embedded_gemma(embedded_checkpoint: Checkpoint) -> None:
    tensors, meta = embedded_checkpoint.tensors, embedded_checkpoint.metadata
    assert embedded_checkpoint.architecture == "gemma3" and len(tensors) == 236
    assert tensors["token_embd.weight"].shape == (262144, 640)
    assert tensors["blk.0.attn_q.weight"].shape == (1024, 640)
    assert tensors["blk.0.attn_k.weight"].shape == (256, 640)
    assert tensors["blk.0.ffn_down.weight"].shape == (640, 2048)
    assert tensors["blk.17.post_ffw_norm.weight"].shape == (640,)
    assert all(_backed_by_mmap(t.data) for t in tensors.values())
    assert meta["gemma3.block_count"] == 18 and meta["gemma3.attention.sliding_window"] == 512
    assert meta["tokenizer.ggml.bos_token_id"] == 2 and meta["tokenizer.ggml.add_bos_token"] is True
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 262144 and tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert len(meta["tokenizer.ggml.scores"]) == 262144 and meta["tokenizer.ggml.token_type"][:3] == [3, 3, 3]
    assert embedded_checkpoint.quantization == "Q4_K_M (Q8_0, Q5_0, Q4_K, Q6_K, F32)"
    assert 260_000_000 < embedded_checkpoint.parameter_count < 280_000_000


def _tensor_type_offset(raw: bytes, name: str) -> int:
    """Byte offset of a tensor's type id in the header: after its name, n_dims and dims."""
    name_end = raw.index(name.encode()) + len(name)
    (n_dims,) = struct.unpack_from("<I", raw, name_end)
    return name_end + 4 + 8 * n_dims


def _error(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        read_gguf(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_gguf_missing_file(tmp_path: Path) -> None:
    assert "no such" in _error(tmp_path / "absent.gguf")
    with pytest.raises(CheckpointError, match="no such file or folder"):
        open_checkpoint(tmp_path / "absent.gguf")


def test_gguf_bad_magic_and_versions(small_gguf: Path) -> None:
    raw = bytearray(small_gguf.read_bytes())
    cases = {
        b"GGML": "not a GGUF file",
        struct.pack("<I", 1): "version 1 ",
        struct.pack("<I", 4): "version 4 ",
    }
    for patch, expected in cases.items():
        patched = bytearray(raw)
        offset = 0 if patch == b"GGML" else 4
        patched[offset : offset + 4] = patch
        small_gguf.write_bytes(patched)
        assert expected in _error(small_gguf)
    patched = bytearray(raw)
    patched[4:8] = struct.pack(">I", 3)
    small_gguf.write_bytes(patched)
    assert "big-endian" in _error(small_gguf)


def test_gguf_truncated(small_gguf: Path) -> None:
    raw = small_gguf.read_bytes()
    small_gguf.write_bytes(raw[:-100])
    message = _error(small_gguf)
    assert "file is truncated: tensor '" in message and "but the file has" in message
    small_gguf.write_bytes(raw[:200])  # inside the metadata
    assert "truncated" in _error(small_gguf)
    small_gguf.write_bytes(raw[:10])
    assert "truncated" in _error(small_gguf)


def test_gguf_duplicate_tensor_name(tmp_path: Path) -> None:
    tensors = {name: (np.zeros(32, np.float32), None) for name in ("blk.0.aaa.weight", "blk.0.bbb.weight")}
    path = _write_gguf(tmp_path / "dup.gguf", tensors)
    path.write_bytes(path.read_bytes().replace(b"blk.0.bbb.weight", b"blk.0.aaa.weight"))
    assert "tensor 'blk.0.aaa.weight' appears twice" in _error(path)


@pytest.mark.parametrize(
    ("ggml_type", "block_bytes"), [(GGMLQuantizationType.Q2_K, 84), (GGMLQuantizationType.Q3_K, 110)]
)
def test_gguf_real_tensor_of_unsupported_type(
    tmp_path: Path, ggml_type: GGMLQuantizationType, block_bytes: int
) -> None:
    tensors = _sample_tensors()
    tensors["blk.1.ffn_up.weight"] = (np.zeros((2, 2 * block_bytes), np.uint8), ggml_type)
    path = _write_gguf(tmp_path / "unsupported.gguf", tensors)
    message = _error(path)
    assert (
        f"tensor 'blk.1.ffn_up.weight' has type {ggml_type.name}, which this engine does not support"
        in message
    )
    assert "Supported: F32, F16, BF16, Q4_0" in message


def test_gguf_corrupt_type_id(small_gguf: Path) -> None:
    raw = bytearray(small_gguf.read_bytes())
    offset = _tensor_type_offset(bytes(raw), "blk.0.attn_v.weight")
    assert struct.unpack_from("<I", raw, offset)[0] == GGMLQuantizationType.Q8_0
    raw[offset : offset + 4] = struct.pack("<I", 9999)
    small_gguf.write_bytes(raw)
    message = _error(small_gguf)
    assert "tensor 'blk.0.attn_v.weight' has type id 9999" in message and "unknown" in message
    raw[offset : offset + 4] = struct.pack("<I", GGMLQuantizationType.IQ2_XXS)
    small_gguf.write_bytes(raw)
    assert "has type IQ2_XXS, which this engine does not support" in _error(small_gguf)


# ---------------------------------------------------------------- safetensors


def _bf16_values(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Random bf16 bit patterns and the float32 values they stand for (bf16 = top half of a float32)."""
    floats = rng.standard_normal(shape).astype(np.float32)
    bits = (floats.view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def _write_bf16_file(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write through the safetensors package itself; uint16 arrays are stored as BF16, others as they are."""
    dtype_names = {
        np.dtype(np.uint16): "bfloat16",
        np.dtype(np.float32): "float32",
        np.dtype(np.float16): "float16",
    }
    specs = {
        name: safetensors.TensorSpec(
            dtype=dtype_names[array.dtype],
            shape=list(array.shape),
            data_ptr=array.ctypes.data,
            data_len=array.nbytes,
        )
        for name, array in tensors.items()
    }
    safetensors.serialize_file(specs, str(path))


def _llama_folder(folder: Path) -> dict[str, np.ndarray]:
    """A sharded llama-style folder; returns the float32 values expected under each GGUF name."""
    rng = np.random.default_rng(1)
    folder.mkdir(exist_ok=True)
    shard1 = {
        "model.embed_tokens.weight": rng.standard_normal((10, 8)).astype(np.float32),
        "model.layers.0.input_layernorm.weight": rng.standard_normal(8).astype(np.float16),
        "model.layers.0.post_attention_layernorm.weight": rng.standard_normal(8).astype(np.float32),
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32),
    }
    save_file(shard1, folder / "model-00001-of-00002.safetensors")
    q_bits, q_values = _bf16_values(rng, (8, 8))
    norm_bits, norm_values = _bf16_values(rng, (8,))
    head = rng.standard_normal((10, 8)).astype(np.float16)
    shard2 = {
        "model.layers.0.self_attn.q_proj.weight": q_bits,
        "model.norm.weight": norm_bits,
        "lm_head.weight": head,
    }
    _write_bf16_file(folder / "model-00002-of-00002.safetensors", shard2)
    weight_map = {name: "model-00001-of-00002.safetensors" for name in shard1}
    weight_map.update({name: "model-00002-of-00002.safetensors" for name in shard2})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return {
        "token_embd.weight": shard1["model.embed_tokens.weight"],
        "blk.0.attn_norm.weight": shard1["model.layers.0.input_layernorm.weight"].astype(np.float32),
        "blk.0.ffn_norm.weight": shard1["model.layers.0.post_attention_layernorm.weight"],
        "blk.0.attn_q.weight": q_values,
        "output_norm.weight": norm_values,
        "output.weight": head.astype(np.float32),
    }


def test_safetensors_sharded_folder(tmp_path: Path) -> None:
    expected = _llama_folder(tmp_path / "llama")
    checkpoint = open_checkpoint(tmp_path / "llama")
    assert (checkpoint.format, checkpoint.architecture) == ("safetensors", "llama")
    assert checkpoint.hf_config is not None and checkpoint.hf_config["hidden_size"] == 8
    assert checkpoint.tokenizer_dir == tmp_path / "llama" and checkpoint.metadata == {}
    assert sorted(checkpoint.tensors) == sorted(expected)  # inv_freq skipped
    types = {name: t.qtype.name for name, t in checkpoint.tensors.items()}
    assert types["blk.0.attn_q.weight"] == "BF16" and types["output.weight"] == "F16"
    for name, values in expected.items():
        tensor = checkpoint.tensors[name]
        assert tensor.name == name and tensor.shape == values.shape
        assert _backed_by_mmap(tensor.data)
        np.testing.assert_array_equal(tensor.dequantize(), values)
    assert checkpoint.quantization == "mixed (F32, F16, BF16)"
    assert open_checkpoint(tmp_path / "llama" / "model-00001-of-00002.safetensors").path == tmp_path / "llama"


def test_safetensors_gemma3_multimodal_names(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    names = {
        "model.language_model.layers.0.post_attention_layernorm.weight": "blk.0.post_attention_norm.weight",
        "model.language_model.layers.0.pre_feedforward_layernorm.weight": "blk.0.ffn_norm.weight",
        "model.language_model.layers.0.post_feedforward_layernorm.weight": "blk.0.post_ffw_norm.weight",
        "model.language_model.layers.0.self_attn.q_norm.weight": "blk.0.attn_q_norm.weight",
        "model.language_model.embed_tokens.weight": "token_embd.weight",
    }
    tensors = {name: rng.standard_normal(4).astype(np.float32) for name in names}
    tensors["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = np.ones(4, np.float32)
    tensors["model.multi_modal_projector.mm_input_projection_weight"] = np.ones(4, np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"]}))
    checkpoint = open_checkpoint(tmp_path)
    assert checkpoint.architecture == "gemma3" and checkpoint.tokenizer_dir is None
    assert sorted(checkpoint.tensors) == sorted(names.values())
    for hf, ours in names.items():
        np.testing.assert_array_equal(checkpoint.tensors[ours].dequantize(), tensors[hf])
    assert checkpoint.quantization == "F32"


@pytest.mark.parametrize(
    ("architecture", "hf", "expected"),
    [
        ("llama", "model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
        ("gemma3", "model.layers.3.post_attention_layernorm.weight", "blk.3.post_attention_norm.weight"),
        ("gemma3", "language_model.model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
        ("gemma3", "language_model.lm_head.weight", "output.weight"),
        ("qwen2", "model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"),
        ("qwen2", "model.layers.11.self_attn.v_proj.bias", "blk.11.attn_v.bias"),
        ("qwen3", "model.layers.2.self_attn.q_norm.weight", "blk.2.attn_q_norm.weight"),
        ("qwen3", "model.layers.2.mlp.down_proj.weight", "blk.2.ffn_down.weight"),
        ("llama", "model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"),
        ("llama", "model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight"),
        ("llama", "model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight"),
        ("llama", "model.norm.weight", "output_norm.weight"),
        ("llama", "model.layers.0.self_attn.rotary_emb.inv_freq", None),
    ],
)
def test_name_tables(architecture: str, hf: str, expected: str | None) -> None:
    assert gguf_name(hf, architecture) == expected


@pytest.mark.parametrize(
    ("architecture", "hf"),
    [
        ("llama", "model.layers.0.self_attn.q_norm.weight"),
        ("qwen2", "model.layers.0.pre_feedforward_layernorm.weight"),
    ],
)
def test_names_foreign_to_the_architecture_are_errors(architecture: str, hf: str) -> None:
    with pytest.raises(
        CheckpointError, match=f"tensor '{hf}' has no GGUF name for architecture '{architecture}'"
    ):
        gguf_name(hf, architecture)


def _qwen2_folder(folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir(exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return folder


def test_safetensors_errors_name_file_and_tensor(tmp_path: Path) -> None:
    folder = _qwen2_folder(
        tmp_path / "unknown", {"model.layers.0.mlp.weird_proj.weight": np.ones(2, np.float32)}
    )
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.weird_proj\.weight'"
    ):
        open_checkpoint(folder)

    folder = _qwen2_folder(tmp_path / "int", {"model.layers.0.self_attn.q_proj.weight": np.ones(2, np.int64)})
    with pytest.raises(CheckpointError, match="has dtype I64, which this engine does not load"):
        open_checkpoint(folder)

    folder = _qwen2_folder(tmp_path / "truncated", {"model.norm.weight": np.ones(64, np.float32)})
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(raw[:-16])
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight'.*truncated"):
        open_checkpoint(folder)

    (folder / "config.json").write_text(
        json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"})
    )
    with pytest.raises(CheckpointError, match=r"config\.json: unsupported model.*MambaForCausalLM"):
        open_checkpoint(folder)


def test_safetensors_index_must_match_shards(tmp_path: Path) -> None:
    folder = tmp_path / "llama"
    _llama_folder(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"lists tensor 'model\.norm\.weight' in model-00001-of-00002"):
        open_checkpoint(folder)


def test_open_checkpoint_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        open_checkpoint(tmp_path)
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"several \.gguf files \(a\.gguf, b\.gguf\)"):
        open_checkpoint(tmp_path)


def test_describe_quantization_without_file_type() -> None:
    from app.engine.quant.dispatch import QuantizedTensor

    bf16 = QuantizedTensor.from_float("a", np.ones((4, 4), np.float32), QUANT_TYPES["BF16"])
    f32 = QuantizedTensor.from_float("b", np.ones(4, np.float32), QUANT_TYPES["F32"])
    assert describe_quantization({"a": bf16}) == "BF16"
    assert describe_quantization({"a": bf16, "b": f32}) == "mixed (BF16, F32)"
    assert describe_quantization({"a": bf16, "b": f32}, {"general.file_type": 32}) == "BF16 (BF16, F32)"

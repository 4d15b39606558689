"""The safetensors loader's quantized layouts: codes joined with their scale tensors, errors naming the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_quant_split import ref

from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file, read_safetensors_folder
from app.engine.loader.safetensors_write import StoredTensor, write_safetensors
from app.engine.quant.split import E2M1, E4M3FN


def _write(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    write_safetensors(path, {n: StoredTensor(d, a.shape, a) for n, (d, a) in tensors.items()})
    return path


def test_gpt_oss_blocks_and_scales_join_as_mxfp4(tmp_path: Path) -> None:
    blocks, scales = ref("mxfp4_blocks"), ref("mxfp4_scales")
    name = "model.layers.0.mlp.experts.down_proj"
    path = _write(
        tmp_path / "m.safetensors", {f"{name}_blocks": ("U8", blocks), f"{name}_scales": ("U8", scales)}
    )
    tensors = read_safetensors_file(path)
    assert list(tensors) == [name]
    tensor = tensors[name]
    assert tensor.qtype.name == "MXFP4_SPLIT" and tensor.shape == (2, 6, 96)
    assert tensor.scales.dtype == "E8M0" and tensor.scales.group == (1, 32)
    np.testing.assert_array_equal(tensor.dequantize(), ref("mxfp4_weight"))  # transformers' unpacking


def test_compressed_tensors_nvfp4_divides_by_its_global_scale(tmp_path: Path) -> None:
    codes = np.array([[0x21] * 8], np.uint8)  # weights 1.0 (nibble 2), 0.5 (nibble 1), ...
    scale = np.array([[0x38]], np.uint8)  # e4m3 1.0
    path = _write(
        tmp_path / "m.safetensors",
        {
            "a.weight_packed": ("U8", codes),
            "a.weight_scale": ("F8_E4M3", scale),
            "a.weight_global_scale": ("F32", np.array([4.0], np.float32)),
            "a.input_global_scale": ("F32", np.array([2.0], np.float32)),  # activations: dropped
        },
    )
    tensor = read_safetensors_file(path)["a.weight"]
    assert tensor.qtype.name == "NVFP4_SPLIT" and tensor.shape == (1, 16)
    np.testing.assert_array_equal(tensor.dequantize()[0, :2], [E2M1[1] / 4, E2M1[2] / 4])


def test_fp8_scale_layouts(tmp_path: Path) -> None:
    codes = np.full((256, 384), 0x38, np.uint8)  # every weight 1.0 before scaling
    blocks = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    path = _write(
        tmp_path / "m.safetensors",
        {
            "b.weight": ("F8_E4M3", codes),
            "b.weight_scale_inv": ("F32", blocks),
            "c.weight": ("F8_E4M3", codes[:3, :5]),
            "c.weight_scale": ("F32", np.array([[2.0], [3.0], [4.0]], np.float32)),
            "d.weight": ("F8_E4M3", codes[:2, :2]),
            "d.weight_scale": ("F32", np.array(0.5, np.float32)),
            "d.input_scale": ("F32", np.array(1.0, np.float32)),
        },
    )
    tensors = read_safetensors_file(path)
    assert sorted(tensors) == ["b.weight", "c.weight", "d.weight"]
    b = tensors["b.weight"].dequantize()
    assert tensors["b.weight"].scales.group == (128, 128)
    # The file's bytes, not copies: codes and scales are views of the memory-mapped file.
    assert not tensors["b.weight"].data.flags.owndata and not tensors["b.weight"].scales.raw.flags.owndata
    assert not tensors["b.weight"].data.flags.writeable
    assert b[0, 0] == 1 and b[0, 200] == 2 and b[130, 300] == 6
    np.testing.assert_array_equal(tensors["c.weight"].dequantize()[:, 0], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(tensors["d.weight"].dequantize(), np.full((2, 2), 0.5))
    assert E4M3FN[0x38] == 1.0


def test_config_block_size_is_used(tmp_path: Path) -> None:
    # 256 x 256 in 64 x 128 blocks: a 4 x 2 grid, which no 128 x 128 reading explains.
    folder = tmp_path / "m"
    folder.mkdir()
    _write(folder / "model.safetensors", {
        "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", np.full((256, 256), 0x38, np.uint8)),
        "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", np.arange(8, dtype=np.float32).reshape(4, 2)),
    })  # fmt: skip
    tensor = read_safetensors_folder(folder, "qwen3", {"weight_block_size": [64, 128]})["blk.0.attn_q.weight"]
    assert tensor.scales.group == (64, 128) and tensor.dequantize()[255, 255] == 7
    with pytest.raises(CheckpointError, match=r"weight_block_size \[64\] is not \[rows, cols\]"):
        read_safetensors_folder(folder, "qwen3", {"weight_block_size": [64]})


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"w.weight": ("F8_E4M3", np.zeros((2, 4), np.uint8))},
            r"'w.weight' \(F8_E4M3.*no 'w.weight_scale_inv'",
        ),
        (
            {
                "w.weight": ("BF16", np.zeros((2, 4), np.uint16)),
                "w.weight_scale": ("F32", np.ones(1, np.float32)),
            },
            r"'w.weight_scale'.*a scale tensor with no quantized weight",
        ),
        ({"w.weight": ("U8", np.zeros((2, 8), np.uint8))}, r"'w.weight' \(U8.*F8_E4M3 'w.weight_scale'"),
        (
            {
                "w.weight": ("F8_E4M3", np.zeros((4, 4), np.uint8)),
                "w.weight_scale": ("F32", np.ones(3, np.float32)),
            },
            r"'w.weight_scale'.*not a per-tensor, per-channel or block scale",
        ),
        (
            {
                "w_blocks": ("U8", np.zeros((2, 1, 16), np.uint8)),
                "w_scales": ("U8", np.zeros((2, 2), np.uint8)),
            },
            r"'w_blocks'.*MXFP4 blocks must be",
        ),
        (
            {
                "w.weight": ("U8", np.zeros((2, 8), np.uint8)),
                "w.weight_scale": ("F8_E4M3", np.zeros((2, 1), np.uint8)),
            },
            r"NVFP4 codes without weight_scale_2",
        ),
    ],
    ids=["fp8-no-scale", "orphan-scale", "u8-no-scale", "fp8-bad-scale", "mxfp4-shape", "nvfp4-no-global"],
)
def test_bad_quantized_tensors_are_named(tmp_path: Path, tensors: dict, message: str) -> None:
    path = _write(tmp_path / "bad.safetensors", tensors)
    with pytest.raises(CheckpointError, match=message):
        read_safetensors_file(path)


def test_hf_folder_config_quantization_reaches_the_loader(tmp_path: Path) -> None:
    from app.engine.loader.weights import open_checkpoint

    folder = tmp_path / "m"
    folder.mkdir()
    config = json.loads(
        (Path(__file__).resolve().parents[1] / "fixtures" / "quant_mix" / "hf" / "config.json").read_text()
    )
    config["quantization_config"]["weight_block_size"] = "128"
    (folder / "config.json").write_text(json.dumps(config))
    _write(folder / "model.safetensors", {"model.norm.weight": ("F32", np.ones(256, np.float32))})
    with pytest.raises(CheckpointError, match="weight_block_size '128'"):
        open_checkpoint(folder)

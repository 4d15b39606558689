"""Qwen3-ASR's audio tensors from a Hugging Face folder: the audio tower and the projector
(`model.audio_tower.*`, `model.multi_modal_projector.*` in transformers 5's layout; the older one
without `model.`), kept under their names without the prefix, checked against the config's sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.engine.loader.names import CheckpointError
from app.engine.loader.safetensors import read_safetensors_file, weight_files
from app.engine.models.audio.qwen3_asr_config import Qwen3AsrAudioConfig
from app.engine.quant.dispatch import QuantizedTensor

Tensors = dict[str, QuantizedTensor]
_PARTS = {"audio_tower.": "tower.", "multi_modal_projector.": "projector."}


def load_qwen3_asr_audio(folder: Path, cfg: Qwen3AsrAudioConfig) -> Tensors:
    tensors: Tensors = {}
    for file in weight_files(folder):
        for hf_name, tensor in read_safetensors_file(file).items():
            bare = hf_name.removeprefix("model.")
            part = next((p for p in _PARTS if bare.startswith(p)), None)
            if part is not None:
                name = _PARTS[part] + bare[len(part) :]
                tensors[name] = QuantizedTensor(name, tensor.qtype, tensor.shape, tensor.data)
    check_shapes(folder, tensors, cfg, _hf_name, "the Qwen3-ASR checkpoint lacks", "the config needs")
    return tensors


def check_shapes(
    source: Path,
    tensors: Tensors,
    cfg: Qwen3AsrAudioConfig,
    stored_name: Callable[[str], str],
    lacks: str,
    needs: str,
) -> None:
    """Every tensor the encoder reads is there with the shape `cfg` gives it; CheckpointError naming `source`
    and the tensor under the name it has there (`stored_name`) otherwise."""
    for name, shape in expected_shapes(cfg).items():
        found = tensors.get(name)
        if found is None:
            raise CheckpointError(f"{source}: {lacks} {stored_name(name)}")
        if tuple(found.shape) != shape:
            raise CheckpointError(
                f"{source}: {stored_name(name)} has shape {list(found.shape)}, {needs} {list(shape)}"
            )


def _hf_name(name: str) -> str:
    part, rest = name.split(".", 1)
    return "model." + next(hf for hf, ours in _PARTS.items() if ours == f"{part}.") + rest


def expected_shapes(c: Qwen3AsrAudioConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor qwen3_asr.py reads and its shape under `c` (the folder's loader and the mmproj's check both)."""
    d, ch = c.hidden_size, c.conv_channels
    shapes: dict[str, tuple[int, ...]] = {
        "tower.conv2d1.weight": (ch, 1, 3, 3),
        "tower.conv2d2.weight": (ch, ch, 3, 3),
        "tower.conv2d3.weight": (ch, ch, 3, 3),
        "tower.conv_out.weight": (d, ch * c.conv_freq_bins),
        "tower.ln_post.weight": (d,),
        "projector.linear_1.weight": (d, d),
        "projector.linear_2.weight": (c.output_dim, d),
    }
    for i in range(c.num_layers):
        p = f"tower.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{p}.self_attn.{proj}.weight"] = (d, d)
        shapes[f"{p}.fc1.weight"] = (c.ffn_size, d)
        shapes[f"{p}.fc2.weight"] = (d, c.ffn_size)
        shapes[f"{p}.self_attn_layer_norm.weight"] = (d,)
        shapes[f"{p}.final_layer_norm.weight"] = (d,)
    return shapes

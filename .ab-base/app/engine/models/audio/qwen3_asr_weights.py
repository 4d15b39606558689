"""Qwen3-ASR's audio tensors from a Hugging Face folder: the audio tower and the projector
(`model.audio_tower.*`, `model.multi_modal_projector.*` in transformers 5's layout; the older one
without `model.`), kept under their names without the prefix, checked against the config's sizes."""

from __future__ import annotations

from pathlib import Path

from app.engine.models.audio.folder_tensors import Tensors, check_shapes, tensors_by_prefix
from app.engine.models.audio.qwen3_asr_config import Qwen3AsrAudioConfig

_PARTS = {"audio_tower.": "tower.", "multi_modal_projector.": "projector."}


def load_qwen3_asr_audio(folder: Path, cfg: Qwen3AsrAudioConfig) -> Tensors:
    tensors = tensors_by_prefix(folder, _PARTS)
    check_shapes(folder, tensors, expected_shapes(cfg), _PARTS, "Qwen3-ASR checkpoint")
    return tensors


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

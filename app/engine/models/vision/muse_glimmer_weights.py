"""Muse Glimmer's vision side from a Hugging Face folder: `model.vision_tower.*` as `tower.*`,
`model.vision_adapter.*` as `adapter.*`, `model.vision_projection.*` as `projection.*`, with the patch
embedding's temporal halves summed (the processor repeats one frame over them: the product is the same), and
which file the tower comes from for a checkpoint (its folder, a given mmproj, or the mmproj beside a GGUF)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.engine.loader.names import CheckpointError
from app.engine.loader.processor_config import read_processor_settings
from app.engine.models.vision.muse_glimmer_config import (
    TEXT_RMS_EPS,
    MuseGlimmerVisionConfig,
    muse_glimmer_vision_config,
)
from app.engine.models.vision.muse_glimmer_mmproj import load_muse_glimmer_mmproj
from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
from app.engine.models.vision.weights import find_mmproj, parsed_in, read_prefixed
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]
_PREFIXES = {"model.vision_tower.": "tower.", "model.vision_adapter.": "adapter.", "model.vision_projection.": "projection."}
PATCH_EMBEDDING = "tower.patch_embedder.patch_embedding.weight"


def expected_tensors(cfg: MuseGlimmerVisionConfig) -> list[str]:
    """The names the tower reads (muse_glimmer_vision.py), in HF naming under its prefixes."""
    names = [PATCH_EMBEDDING, "tower.patch_embedder.position_embedding_table.weight", "adapter.fc1.weight",
             "adapter.fc2.weight", "projection.weight"]  # fmt: skip
    names += [f"tower.{n}.{k}" for n in ("ln_pre", "ln_post") for k in ("weight", "bias")]
    for i in range(cfg.num_layers):
        parts = ("norm1", "norm2", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.proj", "mlp.fc1", "mlp.fc2")
        names += [f"tower.layers.{i}.{p}.{k}" for p in parts for k in ("weight", "bias")]
    return names


def load_muse_glimmer_vision(folder: Path, hf_config: dict) -> tuple[MuseGlimmerVisionConfig, Tensors] | None:
    """The vision side of a MuseGlimmerForConditionalGeneration folder; None without a vision_config."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    cfg = parsed_in(folder, lambda: muse_glimmer_vision_config(hf_config, settings.values, settings.source))
    tensors = read_prefixed(folder, _PREFIXES)
    missing = [n for n in expected_tensors(cfg) if n not in tensors]
    if missing:
        raise CheckpointError(f"{folder}: the vision checkpoint lacks {', '.join(missing[:4])}")
    patch = tensors[PATCH_EMBEDDING].dequantize().reshape(cfg.hidden_size, cfg.temporal_patch_size, cfg.frame_dim)
    tensors[PATCH_EMBEDDING] = QuantizedTensor.from_float(PATCH_EMBEDDING, patch.sum(axis=1, dtype=np.float32), _F32)
    return cfg, tensors


def text_rms_eps(checkpoint: Any) -> float:
    """The text model's RMS epsilon, at which the image features are normed as its token embeddings are."""
    if checkpoint.format == "gguf":
        key = f"{checkpoint.architecture}.attention.layer_norm_rms_epsilon"
        return float(checkpoint.metadata.get(key, TEXT_RMS_EPS))
    text = (checkpoint.hf_config or {}).get("text_config") or {}
    return float(text.get("rms_norm_eps", TEXT_RMS_EPS))


def load_muse_glimmer_tower(
    checkpoint: Any, backend: Any, mmproj: str | Path | None
) -> MuseGlimmerVisionTower | None:
    """From the given mmproj, the mmproj beside a GGUF, or the folder's own tensors; None without any."""
    text_hidden = checkpoint.tensors["token_embd.weight"].shape[1]
    if mmproj is None and checkpoint.format == "gguf":
        mmproj = find_mmproj(checkpoint.path)
        if mmproj is None:
            return None
    if mmproj is not None:
        cfg, tensors = load_muse_glimmer_mmproj(Path(mmproj), text_hidden, text_rms_eps(checkpoint))
    else:
        loaded = load_muse_glimmer_vision(Path(checkpoint.path), checkpoint.hf_config or {})
        if loaded is None:
            return None
        cfg, tensors = loaded
    width = tensors["projection.weight"].shape[0]
    if width != text_hidden:
        raise CheckpointError(
            f"{mmproj or checkpoint.path}: the vision projection outputs width {width}, the text model's is {text_hidden}"
        )
    return MuseGlimmerVisionTower(backend, cfg, tensors)

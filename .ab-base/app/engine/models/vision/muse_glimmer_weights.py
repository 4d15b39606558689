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
    tower_shapes,
)
from app.engine.models.vision.muse_glimmer_mmproj import PATCH, load_muse_glimmer_mmproj
from app.engine.models.vision.muse_glimmer_vision import MuseGlimmerVisionTower
from app.engine.models.vision.weights import find_mmproj, parsed_in, read_prefixed
from app.engine.quant.dispatch import QuantizedTensor
from app.engine.quant.types import QUANT_TYPES

Tensors = dict[str, QuantizedTensor]
_F32 = QUANT_TYPES["F32"]
_PREFIXES = {"model.vision_tower.": "tower.", "model.vision_adapter.": "adapter.", "model.vision_projection.": "projection."}


def load_muse_glimmer_vision(folder: Path, hf_config: dict) -> tuple[MuseGlimmerVisionConfig, Tensors] | None:
    """The vision side of a MuseGlimmerForConditionalGeneration folder; None without a vision_config."""
    if "vision_config" not in hf_config:
        return None
    settings = read_processor_settings(folder, "image_processor")
    cfg = parsed_in(folder, lambda: muse_glimmer_vision_config(hf_config, settings.values, settings.source))
    tensors = read_prefixed(folder, _PREFIXES)
    checked(folder, tensors, tower_shapes(cfg))
    patch = tensors[PATCH].dequantize().reshape(cfg.hidden_size, cfg.temporal_patch_size, cfg.frame_dim)
    tensors[PATCH] = QuantizedTensor.from_float(PATCH, patch.sum(axis=1, dtype=np.float32), _F32)
    return cfg, tensors


def _hf_name(name: str) -> str:
    prefix, rest = name.split(".", 1)
    return next(hf for hf, ours in _PREFIXES.items() if ours == f"{prefix}.") + rest


def checked(folder: Path, tensors: Tensors, shapes: dict[str, tuple[int, ...]]) -> None:
    """CheckpointError naming the folder and the first tensor missing or of the wrong shape."""
    missing = [_hf_name(n) for n in shapes if n not in tensors]
    if missing:
        raise CheckpointError(f"{folder}: the vision checkpoint lacks {', '.join(missing[:4])}")
    for name, shape in shapes.items():
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{folder}: tensor {_hf_name(name)} has shape {tuple(tensors[name].shape)}, expected {shape}"
            )


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

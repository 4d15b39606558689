"""PaddleOCR-VL's vision tower from a llama.cpp mmproj GGUF (projector type `paddleocr`).

llama.cpp's converter (its PaddleOCRVisionModel class) keeps the tensors as they are and
names them as paddleocr_config.py does (`v.*`, `mm.input_norm`, `mm.1`, `mm.2`), so only the config
is read differently: `clip.vision.image_size` holds sqrt(max_pixels), not the learned position
grid's side, which therefore comes from `v.position_embd.weight`'s rows (a square grid), and the
processor's bounds are `clip.vision.image_min_pixels` / `image_max_pixels`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from app.engine.loader.gguf import read_gguf
from app.engine.loader.names import CheckpointError
from app.engine.models.vision.paddleocr_config import ROPE_THETA, PaddleVisionConfig, Tensors, check_tensors
from app.engine.models.vision.qwen_vl_mmproj import image_mean_std, projector_type

PROJECTOR = "paddleocr"
MERGE = 2  # clip.cpp's n_merge for this projector


def paddle_config_from_gguf(
    meta: dict[str, Any], tensors: Tensors, text_hidden_size: int
) -> PaddleVisionConfig:
    """From an mmproj GGUF's `clip.*` keys; CheckpointError naming what is missing or unsupported."""
    projector = projector_type(meta)
    if projector != PROJECTOR:
        raise CheckpointError(
            f"mmproj projector type {projector!r} is not PaddleOCR-VL's ({PROJECTOR!r}): it does not go with this model"
        )

    def key(name: str) -> int:
        full = f"clip.vision.{name}"
        value = meta.get(full)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"mmproj metadata has no positive whole number {full} (found {value!r})")
        return value

    positions = tensors.get("v.position_embd.weight")
    if positions is None:
        raise CheckpointError("the mmproj lacks v.position_embd.weight (the learned position grid)")
    grid = math.isqrt(positions.shape[0])
    if grid * grid != positions.shape[0]:
        raise CheckpointError(f"v.position_embd.weight has {positions.shape[0]} rows: not a square grid")
    mean, std = image_mean_std(meta)
    patch = key("patch_size")
    return PaddleVisionConfig(
        num_layers=key("block_count"),
        hidden_size=key("embedding_length"),
        intermediate_size=key("feed_forward_length"),
        num_heads=key("attention.head_count"),
        num_channels=3,
        patch_size=patch,
        position_grid=grid,
        merge_size=MERGE,
        layer_norm_eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        text_hidden_size=text_hidden_size,
        rope_theta=ROPE_THETA,
        min_pixels=key("image_min_pixels"),
        max_pixels=key("image_max_pixels"),
        image_mean=mean,
        image_std=std,
    ).check("mmproj metadata", "mmproj metadata")


def load_paddle_mmproj(path: Path, text_hidden_size: int) -> tuple[PaddleVisionConfig, Tensors]:
    """A PaddleOCR-VL mmproj GGUF: the tower's config and its tensors (CheckpointError naming the file)."""
    file = read_gguf(path)
    tensors = dict(file.tensors)
    try:
        cfg = paddle_config_from_gguf(file.metadata, tensors, text_hidden_size)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    check_tensors(cfg, tensors, str(path))
    return cfg, tensors

"""The engine's vision glue: load a model's vision tower beside its text model, and place a
request's images over their runs of image tokens (checked, with errors naming the mismatch)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from app.engine.core.audio import NoAudioError
from app.engine.images import VISION_ARCHITECTURES, ImageInput, PromptImage
from app.engine.loader.names import CheckpointError
from app.engine.models.vision import (
    Gemma4VisionTower,
    MuseGlimmerVisionTower,
    PaddleVisionTower,
    QwenVisionModel,
    load_vision,
)
from app.engine.models.vision.gemma4_processing import Gemma4ImagePrompter
from app.engine.models.vision.muse_glimmer_processing import MuseGlimmerImagePrompter
from app.engine.models.vision.paddleocr_processing import PaddleImagePrompter
from app.engine.models.vision.prompter import ImagePrompter
from app.engine.models.vision.qwen_vl_prompter import QwenImagePrompter
from app.engine.models.vision.splice import image_spans
from app.engine.worker.images import ImageEmbedder

log = logging.getLogger(__name__)


class NoVisionError(ValueError):
    """An image was sent to a model without a vision tower."""


def attach_vision(runner: Any, checkpoint: Any, tokenizer: Any, mmproj: str | None) -> ImagePrompter | None:
    """Load the checkpoint's vision tower (its own, `mmproj`, or an mmproj beside a GGUF) and give
    the runner its image embedder; the prompter for the server, or None for a text-only model."""
    if checkpoint.architecture not in VISION_ARCHITECTURES:
        if mmproj is not None:
            raise CheckpointError(
                f"--mmproj given, but {checkpoint.architecture} models take no images here "
                f"(vision: {', '.join(VISION_ARCHITECTURES)})"
            )
        return None
    vision = load_vision(checkpoint, runner.backend, mmproj)
    if vision is None:
        return None
    runner.images = ImageEmbedder(vision, runner.backend)
    if isinstance(vision, QwenVisionModel):
        cfg = vision.config
        runner.mrope_merge = cfg.merge_size  # its text model places image tokens by M-RoPE
        log.info(
            "vision tower: %d layers, %d..%d pixels per image", cfg.depth, cfg.min_pixels, cfg.max_pixels
        )
        return QwenImagePrompter(cfg, tokenizer)
    if isinstance(vision, PaddleVisionTower):
        p = vision.config
        runner.mrope_merge = p.merge_size  # its ERNIE text model places image tokens by M-RoPE
        log.info("vision tower: %d layers, %d..%d pixels per page", p.num_layers, p.min_pixels, p.max_pixels)
        return PaddleImagePrompter(p, tokenizer)
    if isinstance(vision, Gemma4VisionTower):
        g = vision.config
        log.info("vision tower: %d layers, up to %d tokens per image", g.num_layers, g.max_soft_tokens)
        return Gemma4ImagePrompter(g, tokenizer)
    if isinstance(vision, MuseGlimmerVisionTower):
        m = vision.config
        log.info("vision tower: %d layers, up to %d tokens per image", m.num_layers, m.max_image_tokens)
        return MuseGlimmerImagePrompter(m, tokenizer)
    log.info(
        "vision tower: %d layers, %d px, %d tokens per image",
        vision.config.num_layers, vision.config.image_size, vision.config.tokens_per_image,
    )  # fmt: skip
    return ImagePrompter(vision.config, tokenizer)


def place_images(
    prompter: ImagePrompter | None,
    token_ids: Sequence[int],
    images: Sequence[ImageInput],
    audio: Any = None,
) -> list[PromptImage]:
    """Each image (and audio clip, by `audio`'s token) over its run of soft tokens, in prompt order;
    ValueError when a modality's runs and inputs do not pair up. Without inputs the prompt is text,
    whatever ids it holds (a raw completion may spell the image token): those tokens keep their own
    embeddings, as on a text-only model; so do one modality's tokens when only the other is sent."""
    if not images:
        return []
    placed = []
    for modality, placer in (("image", prompter), ("audio", audio)):
        items = [item for item in images if item.modality == modality]
        if not items:
            continue
        if placer is None:
            missing = NoVisionError if modality == "image" else NoAudioError
            raise missing(f"the loaded model has no {'vision' if modality == 'image' else 'audio'}: "
                          f"it cannot take {modality}s")  # fmt: skip
        spans = image_spans(token_ids, placer.image_token_id)
        if len(spans) != len(items):
            raise ValueError(
                f"the prompt has {len(spans)} runs of {modality} tokens for {len(items)} {modality}s"
            )
        for (start, end), item in zip(spans, items, strict=True):
            expected = placer.tokens_for(item)
            if end - start != expected:
                raise ValueError(
                    f"the {modality} tokens at {start}..{end - 1} are {end - start}, not the {expected} "
                    f"{'an image' if modality == 'image' else 'the clip'} takes"
                )
            placed.append(PromptImage(start, end, item))
    return sorted(placed, key=lambda p: p.start)
